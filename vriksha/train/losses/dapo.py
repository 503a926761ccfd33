"""`grpo.loss_type: dapo` (the default): the clipped token-level policy loss of DAPO, summed over every
generated token of the step and divided by their number.

Per generated token t, with the `LossInputs` names:

    ratio     = exp(logprobs - old_logprobs)
    surrogate = min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)     (clip-higher: two bounds)
    kl_k3     = exp(ref - logprobs) - (ref - logprobs) - 1                       (only with kl_coef > 0)
    w         = min(exp(old_logprobs - sampling_logprobs), importance_cap)       (truncated importance
                weight, detached, with importance_correction: corrects the engine's numerics, or the lag
                of an off-policy batch, against the trainer's)
    loss      = sum_t mask_t * w_t * (-surrogate_t + kl_coef * kl_k3_t) / num_tokens_global

`num_tokens_global` counts the generated tokens of the whole step on every rank, so each token weighs
the same whatever rank or micro-batch it lands in, and gradients summed over ranks equal the
single-process gradient. The advantages A are the group's (`grpo.scale_rewards` divides them by the
group's reward std; see `train/grpo.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from vriksha.train.losses.base import LossInputs, LossOutputs, register_loss
from vriksha.train.losses.kl import k3_kl

if TYPE_CHECKING:
    from vriksha.train.config import GRPOConfig

__all__ = ["DAPOLoss"]


@dataclass(frozen=True, slots=True)
class DAPOLoss:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    importance_correction: bool = True
    importance_cap: float = 2.0

    # sums over the generated tokens; a step reports each per token
    metric_names: ClassVar[tuple[str, ...]] = (
        "clip_fraction",  # tokens whose ratio the clip held (the gradient stops there)
        "kl",  # k3 KL to the reference
        "ratio/mean",  # pi_theta / pi_old
        "importance_weight/mean",  # the truncated weight (1 without importance correction)
        "logprob_gap/mean",  # |log pi_old - log mu|: how far the trainer's numerics are from the engine's
    )

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> DAPOLoss:
        return cls(cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.importance_correction, cfg.importance_cap)

    def __call__(self, inputs: LossInputs) -> LossOutputs:
        if inputs.num_tokens_global <= 0:
            raise ValueError(f"num_tokens_global must be > 0, got {inputs.num_tokens_global}")
        logprobs, old_logprobs = inputs.logprobs, inputs.old_logprobs
        mask = inputs.loss_mask.to(logprobs.dtype)
        adv = inputs.advantages[:, None] if inputs.advantages.dim() == 1 else inputs.advantages
        ratio = torch.exp(logprobs - old_logprobs)
        clipped_ratio = torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
        per_token = -surrogate
        kl = None
        if inputs.ref_logprobs is not None and self.kl_coef > 0:
            kl = k3_kl(logprobs, inputs.ref_logprobs)
            per_token = per_token + self.kl_coef * kl
        weight = mask
        iw = None
        engine_logprobs = inputs.sampling_logprobs if self.importance_correction else None
        if engine_logprobs is not None:
            iw = torch.exp(old_logprobs.detach() - engine_logprobs).clamp(max=self.importance_cap)
            weight = weight * iw
        loss = (per_token * weight).sum() / inputs.num_tokens_global

        with torch.no_grad():
            is_clipped = ((ratio < 1.0 - self.clip_low) & (adv < 0)) | (
                (ratio > 1.0 + self.clip_high) & (adv > 0)
            )
            gap = (old_logprobs - engine_logprobs).abs() if engine_logprobs is not None else None
            metrics = {
                "clip_fraction": float((is_clipped.to(mask.dtype) * mask).sum()),
                "kl": float((kl * mask).sum()) if kl is not None else 0.0,
                "ratio/mean": float((ratio * mask).sum()),
                "importance_weight/mean": float((iw * mask).sum()) if iw is not None else float(mask.sum()),
                "logprob_gap/mean": float((gap * mask).sum()) if gap is not None else 0.0,
            }
            return LossOutputs(loss, float(mask.sum()), metrics)


register_loss("dapo", DAPOLoss.from_config)
