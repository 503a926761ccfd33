"""How a loss turns per-token terms into the scalar a micro-batch backpropagates.

Each is written so that the step's gradient is the sum over its micro-batches and ranks (the update
backpropagates every micro-batch's scalar and sums): with equal micro-batches they equal TRL's loss_type of
the same name under gradient accumulation. `x` is [B, T] (or [B, 1], broadcast over the mask).

    token_sum         (dapo, cispo)  sum_{i,t} m x / N_tokens                    N over the whole step
    sequence_mean     (grpo, gspo)   sum_i (sum_t m x / max(1, sum_t m)) / N_sequences
    batch_token_mean  (bnpo)         (sum_{i,t} m x / max(1, sum_{i,t} m)) / N_micro_batches
    constant_length   (dr_grpo)      sum_{i,t} m x / (N_sequences * L_max)       L_max = max_completion_length
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from vriksha.train.losses.base import LossInputs

__all__ = ["Aggregation", "aggregate"]

Aggregation = Literal["token_sum", "sequence_mean", "batch_token_mean", "constant_length"]


def aggregate(kind: Aggregation, x: Tensor, mask: Tensor, inputs: LossInputs, max_length: int) -> Tensor:
    masked = x * mask
    if kind == "token_sum":
        return masked.sum() / inputs.num_tokens_global
    if kind == "sequence_mean":
        per_sequence = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
        return per_sequence.sum() / inputs.num_sequences_global
    if kind == "batch_token_mean":
        return masked.sum() / mask.sum().clamp(min=1.0) / inputs.num_micro_batches_global
    if kind == "constant_length":
        return masked.sum() / (inputs.num_sequences_global * max_length)
    raise ValueError(f"unknown aggregation {kind!r}")
