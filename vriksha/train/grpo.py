"""The GRPO objective: group-relative advantages and the clipped, token-level policy loss.

Notation per completion token t: `logprobs` = log pi_theta(t) (with grad), `old_logprobs` =
log pi_old(t) (the policy that the batch is credited to; with one optimizer step per batch it is
`logprobs.detach()`, so no extra forward is needed), `engine_logprobs` = log mu(t), the log-prob the
engine reported when it sampled t, `ref_logprobs` = log pi_ref(t) of the frozen initial model.

    ratio    = exp(logprobs - old_logprobs)
    surrogate = min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    kl_k3    = exp(ref - logprobs) - (ref - logprobs) - 1                 (Schulman's k3, >= 0)
    w        = min(exp(old_logprobs - engine_logprobs), importance_cap)   (truncated importance weight,
               detached: corrects the mismatch between the engine's numerics and the trainer's)
    loss     = sum_t mask_t * w_t * (-surrogate_t + kl_coef * kl_k3_t) / N_global

N_global is the number of completion tokens in the whole step across every rank (an all_reduce),
so each token weighs the same whatever rank or micro-batch it lands in, and gradients summed over
ranks equal the single-process gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["GroupAdvantages", "group_advantages", "has_signal", "LossStats", "grpo_token_loss", "k3_kl"]


@dataclass(slots=True)
class GroupAdvantages:
    advantages: Tensor  # [groups, group_size]: reward minus the group mean, optionally / std
    keep: Tensor  # [groups] bool: False for groups whose rewards are all equal (no signal)
    num_zero_variance: int


SIGNAL_EPS = 1e-6  # rewards closer than this count as equal


def has_signal(group: Sequence[Any]) -> bool:
    """Whether a group's rewards differ (`Episode`s or anything with `.reward`)."""
    rewards = [e.reward for e in group]
    return max(rewards) - min(rewards) > SIGNAL_EPS


def group_advantages(rewards: Tensor, scale: bool = True, eps: float = SIGNAL_EPS) -> GroupAdvantages:
    """`rewards` is [groups, group_size]. Zero-variance groups get advantage 0 and `keep=False`.

    The std is the sample standard deviation (Bessel-corrected), as in the GRPO paper's code and TRL.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, group_size >= 2], got shape {tuple(rewards.shape)}")
    rewards = rewards.double()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    keep = (rewards.max(dim=1).values - rewards.min(dim=1).values) > eps
    adv = rewards - mean
    if scale:
        adv = adv / (std + eps)
    adv = torch.where(keep[:, None], adv, torch.zeros_like(adv))
    return GroupAdvantages(adv.float(), keep, int((~keep).sum()))


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = ref - logprobs."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


@dataclass(slots=True)
class LossStats:
    """Sums over the masked tokens of one micro-batch; divide by the token count for means."""

    tokens: float = 0.0
    clipped: float = 0.0
    kl: float = 0.0
    ratio: float = 0.0
    importance_weight: float = 0.0
    logprob_gap: float = 0.0  # |log pi_old - log mu|: how far the trainer's numerics are from the engine's

    def add(self, other: LossStats) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def grpo_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    num_tokens_global: float,
    engine_logprobs: Tensor | None = None,
    importance_cap: float = 2.0,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, LossStats]:
    """Clipped GRPO loss of one micro-batch, normalised by the global completion-token count.

    Shapes: `logprobs`, `old_logprobs`, `mask`, `engine_logprobs`, `ref_logprobs` are [B, T];
    `advantages` is [B] (one per sequence) or [B, T]. Returns the scalar loss to backpropagate
    and the micro-batch's summed statistics.
    """
    if num_tokens_global <= 0:
        raise ValueError(f"num_tokens_global must be > 0, got {num_tokens_global}")
    mask = mask.to(logprobs.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    per_token = -surrogate
    kl = None
    if ref_logprobs is not None and kl_coef > 0:
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl
    weight = mask
    iw = None
    if engine_logprobs is not None:
        iw = torch.exp(old_logprobs.detach() - engine_logprobs).clamp(max=importance_cap)
        weight = weight * iw
    loss = (per_token * weight).sum() / num_tokens_global

    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - clip_low) & (adv < 0)) | ((ratio > 1.0 + clip_high) & (adv > 0))
        stats = LossStats(
            tokens=float(mask.sum()),
            clipped=float((is_clipped.to(mask.dtype) * mask).sum()),
            kl=float((kl * mask).sum()) if kl is not None else 0.0,
            ratio=float((ratio * mask).sum()),
            importance_weight=float((iw * mask).sum()) if iw is not None else float(mask.sum()),
            logprob_gap=float(((old_logprobs - engine_logprobs).abs() * mask).sum())
            if engine_logprobs is not None
            else 0.0,
        )
    return loss, stats
