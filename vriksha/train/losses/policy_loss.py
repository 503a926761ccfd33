"""The policy-gradient losses of the GRPO family, each as its paper and TRL's `GRPOTrainer` define it.

One computation, three choices: the ratio's level, the surrogate, and the aggregation (`aggregation.py`).
Per completion i and generated token t (the `LossInputs` names; m the loss mask):

    log r_t   = logprobs - old_logprobs                          ratio level token
    log r_i   = sum_t m log r_t / max(1, sum_t m)                ratio level sequence (GSPO), one per completion
    clipped:  x = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
    cispo:    x = -sg(min(r, cispo_cap)) A logprobs              (the weight is clipped and detached, never the
                                                                  gradient of a token)
    x        *= off-policy sequence mask                         (with off_policy_mask_threshold)
    x        *= w                                                (importance weight pi_old / mu, see importance.py)
    x        += kl_coef * k3 (* r with kl_importance_correction) (with kl_coef > 0; k3 against the reference)
    loss      = aggregate(x) - entropy_coef * sum_{i,t} m H_t / N_tokens

    name      ratio     surrogate  aggregation
    grpo      token     clipped    sequence_mean       (GRPO, DeepSeekMath)
    dr_grpo   token     clipped    constant_length     (Dr. GRPO: / max_completion_length)
    dapo      token     clipped    token_sum           (DAPO; the default)
    bnpo      token     clipped    batch_token_mean    (per micro-batch token mean)
    gspo      sequence  clipped    sequence_mean       (GSPO: TRL's importance_sampling_level sequence + grpo)
    cispo     token     cispo      token_sum           (MiniMax-M1 CISPO; TRL's epsilon_high is cispo_cap)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import Tensor

from vriksha.train.losses.aggregation import Aggregation, aggregate
from vriksha.train.losses.base import LossInputs, LossOutputs, register_loss
from vriksha.train.losses.importance import ImportanceCorrection, off_policy_mask
from vriksha.train.losses.kl import k3_kl

if TYPE_CHECKING:
    from vriksha.train.config import GRPOConfig

__all__ = ["LOSS_SHAPES", "PolicyLoss"]

RatioLevel = Literal["token", "sequence"]
Surrogate = Literal["clipped", "cispo"]

# loss_type -> (ratio level, surrogate, aggregation)
LOSS_SHAPES: dict[str, tuple[RatioLevel, Surrogate, Aggregation]] = {
    "grpo": ("token", "clipped", "sequence_mean"),
    "dr_grpo": ("token", "clipped", "constant_length"),
    "dapo": ("token", "clipped", "token_sum"),
    "bnpo": ("token", "clipped", "batch_token_mean"),
    "gspo": ("sequence", "clipped", "sequence_mean"),
    "cispo": ("token", "cispo", "token_sum"),
}


@dataclass(frozen=True, slots=True)
class PolicyLoss:
    ratio_level: RatioLevel = "token"
    surrogate: Surrogate = "clipped"
    aggregation: Aggregation = "token_sum"
    clip_low: float = 0.2
    clip_high: float = 0.28
    cispo_cap: float = 5.0
    kl_coef: float = 0.0
    kl_importance_correction: bool = True
    entropy_coef: float = 0.0
    importance: ImportanceCorrection = field(default_factory=ImportanceCorrection)
    off_policy_mask_threshold: float | None = None
    max_completion_length: int = 0  # constant_length only

    # sums over the generated tokens; a step reports each per token
    metric_names: ClassVar[tuple[str, ...]] = (
        "clip_fraction",  # tokens whose ratio the clip held (the gradient stops there); cispo: weight capped
        "clip_fraction/low",  # below 1 - clip_low with A < 0
        "clip_fraction/high",  # above 1 + clip_high (cispo: above cispo_cap) with A > 0
        "kl",  # k3 KL to the reference
        "ratio/mean",  # pi_theta / pi_old (level sequence: the completion's ratio on each of its tokens)
        "importance_weight/mean",  # the weight w (1 without importance correction)
        "importance_weight/clipped",  # tokens whose weight was truncated to a bound
        "importance_weight/masked",  # tokens whose weight was set to 0 (importance_mode mask)
        "off_policy_masked",  # tokens of completions the off-policy sequence mask left out
        "logprob_gap/mean",  # |log pi_old - log mu|: how far the trainer's numerics are from the engine's
    )

    @classmethod
    def named(cls, name: str, cfg: GRPOConfig) -> PolicyLoss:
        level, surrogate, aggregation = LOSS_SHAPES[name]
        if aggregation == "constant_length" and not cfg.max_completion_length:
            from vriksha.errors import ConfigError

            raise ConfigError(
                "grpo.max_completion_length: dr_grpo divides by it; set it (a training config sets it from "
                "rollout.max_new_tokens when left null)"
            )
        return cls(
            ratio_level=level,
            surrogate=surrogate,
            aggregation=aggregation,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            cispo_cap=cfg.cispo_cap,
            kl_coef=cfg.kl_coef,
            kl_importance_correction=cfg.kl_importance_correction,
            entropy_coef=cfg.entropy_coef,
            importance=ImportanceCorrection(
                enabled=cfg.importance_correction,
                level=cfg.importance_level,
                mode=cfg.importance_mode,
                cap=cfg.importance_cap,
                floor=cfg.importance_min,
            ),
            off_policy_mask_threshold=cfg.off_policy_mask_threshold,
            max_completion_length=cfg.max_completion_length or 0,
        )

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef > 0

    def _ratio(self, inputs: LossInputs, mask: Tensor) -> Tensor:
        log_ratio = inputs.logprobs - inputs.old_logprobs
        if self.ratio_level == "sequence":
            log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
            log_ratio = log_ratio.unsqueeze(-1)
        return torch.exp(log_ratio)

    def _surrogate(self, ratio: Tensor, adv: Tensor, logprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The per-token policy term and where it was clipped (low, high)."""
        if self.surrogate == "cispo":
            weight = torch.clamp(ratio, max=self.cispo_cap).detach()
            high = (ratio > self.cispo_cap) & (adv > 0)
            return -weight * adv * logprobs, torch.zeros_like(high), high
        clipped = torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        low = (ratio < 1.0 - self.clip_low) & (adv < 0)
        high = (ratio > 1.0 + self.clip_high) & (adv > 0)
        return -torch.minimum(ratio * adv, clipped * adv), low, high

    def __call__(self, inputs: LossInputs) -> LossOutputs:
        if inputs.num_tokens_global <= 0:
            raise ValueError(f"num_tokens_global must be > 0, got {inputs.num_tokens_global}")
        logprobs = inputs.logprobs
        mask = inputs.loss_mask.to(logprobs.dtype)
        adv = inputs.advantages[:, None] if inputs.advantages.dim() == 1 else inputs.advantages
        adv = adv.to(logprobs.dtype)
        ratio = self._ratio(inputs, mask)
        per_token, low, high = self._surrogate(ratio, adv, logprobs)
        kept = None
        if self.off_policy_mask_threshold is not None:
            kept = off_policy_mask(
                adv, logprobs, inputs.sampling_logprobs, mask, self.off_policy_mask_threshold
            )
            per_token = per_token * kept
        iw = None
        if self.importance.enabled:
            iw = self.importance.weights(inputs.old_logprobs, inputs.sampling_logprobs, mask)
            per_token = per_token * iw.weight
        kl = None
        if inputs.ref_logprobs is not None and self.kl_coef > 0:
            kl = k3_kl(logprobs, inputs.ref_logprobs)
            if self.kl_importance_correction:
                kl = kl * ratio
            per_token = per_token + self.kl_coef * kl
        loss = aggregate(self.aggregation, per_token, mask, inputs, self.max_completion_length)
        if self.entropy_coef > 0:
            if inputs.entropy is None:
                raise ValueError("entropy_coef > 0 needs LossInputs.entropy (with its gradient)")
            loss = loss - self.entropy_coef * (inputs.entropy * mask).sum() / inputs.num_tokens_global
        with torch.no_grad():
            metrics = self._metrics(inputs, mask, ratio, low, high, kl, iw, kept)
        return LossOutputs(loss, float(mask.sum()), metrics)

    def _metrics(  # noqa: ANN001
        self, inputs: Any, mask: Tensor, ratio: Any, low: Any, high: Any, kl: Any, iw: Any, kept: Any
    ) -> dict[str, float]:
        def total(x: Tensor | None, default: float = 0.0) -> float:
            return float((x.to(mask.dtype) * mask).sum()) if x is not None else default

        gap = None
        if iw is not None:
            gap = (inputs.old_logprobs - inputs.sampling_logprobs).abs()
        return {
            "clip_fraction": total(low | high),
            "clip_fraction/low": total(low),
            "clip_fraction/high": total(high),
            "kl": total(kl),
            "ratio/mean": total(ratio),
            "importance_weight/mean": total(iw.weight if iw is not None else None, float(mask.sum())),
            "importance_weight/clipped": total(iw.clipped if iw is not None else None),
            "importance_weight/masked": total(iw.masked if iw is not None else None),
            "off_policy_masked": total(1 - kept if kept is not None else None),
            "logprob_gap/mean": total(gap),
        }


def _named_loss(name: str) -> Callable[[Any], PolicyLoss]:
    return lambda cfg: PolicyLoss.named(name, cfg)


for _name in LOSS_SHAPES:
    register_loss(_name, _named_loss(_name))
