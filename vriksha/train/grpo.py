"""GRPO's group-relative advantages: each completion's reward against its group's.

A group is one prompt (one environment episode) played `group_size` times; a completion's advantage is
its reward minus the group's mean, divided by the group's std with `grpo.scale_rewards`. A group whose
rewards are all equal carries no signal and is skipped by the update. The policy loss that weighs the
tokens by these advantages is a plug-in (`train/losses/`, `grpo.loss_type`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["GroupAdvantages", "group_advantages", "has_signal"]


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
