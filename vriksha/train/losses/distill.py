"""On-policy distillation: the student's own samples, scored by a teacher token by token.

The per-token reverse KL on the sampled token t (sampled from the student), with c = opd.kl_coef,

    k_t = log pi_old(t) - log pi_teacher(t)                   (its mean over tokens estimates KL(student || teacher))
    A_t = -c k_t                                              (a per-token advantage, detached)
    x_t = -w_t r_t A_t,   r_t = pi_theta(t) / pi_old(t)       (w: the importance weight pi_old / mu, importance.py)
    loss = sum_{i,t} m x_t / N_tokens                         (N: generated tokens of the whole step)

At the first epoch r_t = 1 with gradient grad log pi_theta(t), so the gradient is c E[k_t grad log pi_theta(t)]:
the per-token (discount 0) score-function gradient of the reverse KL, as prime-rl's `opd`, TRL's GKD with
lambda = 1 (on-policy) and Thinking Machines' on-policy distillation compute it. The step logs
`reverse_kl`, the mean of k_t over generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from vriksha.train.losses.base import LossInputs, LossOutputs
from vriksha.train.losses.importance import ImportanceCorrection

if TYPE_CHECKING:
    from vriksha.train.config import TrainConfig

__all__ = ["ReverseKL"]


@dataclass(frozen=True, slots=True)
class ReverseKL:
    kl_coef: float = 1.0
    importance: ImportanceCorrection = field(default_factory=ImportanceCorrection)

    metric_names: ClassVar[tuple[str, ...]] = (
        "reverse_kl",  # log pi_old - log pi_teacher on the sampled tokens
        "importance_weight/mean",
        "logprob_gap/mean",  # |log pi_old - log mu|
    )

    @classmethod
    def of(cls, cfg: TrainConfig) -> ReverseKL:
        """`opd.kl_coef`, and the importance correction of the `grpo` section."""
        g = cfg.grpo
        return cls(
            cfg.opd.kl_coef,
            ImportanceCorrection(
                g.importance_correction,
                g.importance_level,
                g.importance_mode,
                g.importance_cap,
                g.importance_min,
            ),
        )

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutputs:
        if inputs.teacher_logprobs is None:
            raise ValueError("on-policy distillation needs LossInputs.teacher_logprobs")
        logprobs = inputs.logprobs
        mask = inputs.loss_mask.to(logprobs.dtype)
        old = inputs.old_logprobs.detach().to(logprobs.dtype)
        kl = torch.nan_to_num((old - inputs.teacher_logprobs.to(logprobs.dtype)) * mask, nan=0.0)
        ratio = torch.exp(logprobs - old)
        per_token = ratio * (self.kl_coef * kl)  # -r A with A = -c k
        weight = None
        if self.importance.enabled:
            weight = self.importance.weights(old, inputs.sampling_logprobs, mask).weight
            per_token = per_token * weight
        loss = (per_token * mask).sum() / inputs.num_tokens_global
        with torch.no_grad():
            gap = (old - inputs.sampling_logprobs).abs() * mask
            metrics = {
                "reverse_kl": float(kl.sum()),
                "importance_weight/mean": float((weight * mask).sum())
                if weight is not None
                else float(mask.sum()),
                "logprob_gap/mean": float(gap.sum()),
            }
        return LossOutputs(loss, float(mask.sum()), metrics)
