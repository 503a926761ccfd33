"""Corrections for tokens the policy being trained did not sample itself.

The engine samples token t from mu (its own numerics, or weights `rollout.max_staleness` versions old); the
update is credited to pi_old. Two corrections, as TRL names and computes them:

Importance sampling (`grpo.importance_level`, `importance_mode`, `importance_min`, `importance_cap`;
TRL's `vllm_importance_sampling_mode` `{token,sequence}_{truncate,mask}` and its `clip_min`/`clip_max`):

    d_t    = (log pi_old(t) - log mu(t)) * mask_t                 (per token; NaN -> 0)
    rho    = exp(d_t)                     level token: one weight per token
           = exp(sum_t d_t)               level sequence: one weight per completion, on all its tokens
    truncate: w = clamp(rho, C_min, C_max)
    mask:     w = rho where C_min <= rho <= C_max, else 0

The off-policy sequence mask of DeepSeek-V3.2 (`grpo.off_policy_mask_threshold`, TRL's name): a completion
with a negative advantage whose mean KL from mu, mean_t(log mu(t) - log pi_theta(t)), exceeds the
threshold is left out of the policy term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["ImportanceCorrection", "ImportanceWeights", "off_policy_mask"]


@dataclass(slots=True)
class ImportanceWeights:
    weight: Tensor  # [B, T] (level token) or [B, 1] (level sequence), detached
    clipped: Tensor  # same shape, bool: truncated to a bound (mode truncate)
    masked: Tensor  # same shape, bool: set to zero (mode mask)


@dataclass(frozen=True, slots=True)
class ImportanceCorrection:
    enabled: bool = True
    level: Literal["token", "sequence"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    cap: float | None = 2.0  # C_max (None: no upper bound)
    floor: float | None = None  # C_min (None: no lower bound)

    def weights(self, old_logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor) -> ImportanceWeights:
        diff = torch.nan_to_num((old_logprobs.detach() - sampling_logprobs) * mask, nan=0.0)
        if self.level == "sequence":
            diff = diff.sum(dim=-1, keepdim=True)
        ratio = torch.exp(diff)
        low = -math.inf if self.floor is None else self.floor
        high = math.inf if self.cap is None else self.cap
        outside = (ratio < low) | (ratio > high)
        none = torch.zeros_like(outside)
        if self.mode == "truncate":
            return ImportanceWeights(torch.clamp(ratio, min=self.floor, max=self.cap), outside, none)
        return ImportanceWeights(ratio.masked_fill(outside, 0.0), none, outside)


def off_policy_mask(
    advantages: Tensor, logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """[B, 1] (or [B, T] with per-token advantages): 1 to keep, 0 where the advantage is negative and the
    completion's mean KL(mu || pi_theta) over its tokens exceeds `threshold`."""
    kl = torch.nan_to_num(sampling_logprobs - logprobs.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)
