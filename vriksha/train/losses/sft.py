"""The SFT loss: the negative log-likelihood of the target tokens, a mean over the step's target tokens.

    loss = -sum_{i,t} m_t log pi_theta(t) / N_tokens          (m: 1 on assistant tokens; N over the whole step)

With the update's micro-batches and ranks summed, the step's gradient is that of the token mean over every
sequence of the step (TRL's SFTTrainer with `assistant_only_loss`, its loss averaged over the batch's tokens).
"""

from __future__ import annotations

from typing import ClassVar

from vriksha.train.losses.base import LossInputs, LossOutputs

__all__ = ["TokenNLL"]


class TokenNLL:
    metric_names: ClassVar[tuple[str, ...]] = ("nll",)  # summed over target tokens; a step reports the mean

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutputs:
        mask = inputs.loss_mask.to(inputs.logprobs.dtype)
        nll = -(inputs.logprobs * mask).sum()
        return LossOutputs(nll / inputs.num_tokens_global, float(mask.sum()), {"nll": float(nll.detach())})
