"""Collate GRPO groups into shared-prefix tensors.

All completions of a group continue the same prompt, so the prompt is run once per group and
its KV is shared by the group's completions (see `logprobs.py`). Prompts are left-padded (every
prompt ends in the same column), completions right-padded; nothing is retokenised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from vriksha.envs.play import Episode

__all__ = ["GroupBatch", "collate_groups"]


@dataclass(slots=True)
class GroupBatch:
    prompt_ids: Tensor  # [g, P] left-padded
    prompt_mask: Tensor  # [g, P] 1 on real tokens
    completion_ids: Tensor  # [g * G, C] right-padded, group-major
    completion_mask: Tensor  # [g * G, C] 1 on real tokens (generated or environment)
    loss_mask: Tensor  # [g * G, C] 1 on tokens the policy generated
    engine_logprobs: Tensor  # [g * G, C] the engine's log-prob of each generated token
    advantages: Tensor  # [g * G]
    group_size: int

    @property
    def num_sequences(self) -> int:
        return self.completion_ids.shape[0]

    def to(self, device: torch.device | str) -> GroupBatch:
        return GroupBatch(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.completion_ids.to(device),
            self.completion_mask.to(device),
            self.loss_mask.to(device),
            self.engine_logprobs.to(device),
            self.advantages.to(device),
            self.group_size,
        )


def collate_groups(
    groups: Sequence[Sequence[Episode]], advantages: Sequence[Sequence[float]], pad_id: int
) -> GroupBatch:
    if not groups:
        raise ValueError("collate_groups needs at least one group")
    group_size = len(groups[0])
    if any(len(g) != group_size for g in groups):
        raise ValueError("every group must have the same number of completions")
    for g in groups:
        if any(e.prompt_ids != g[0].prompt_ids for e in g):
            raise ValueError("the completions of a group must share one prompt")
    p_len = max(len(g[0].prompt_ids) for g in groups)
    prompt_ids = torch.full((len(groups), p_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(groups), p_len), dtype=torch.long)
    for i, g in enumerate(groups):
        ids = g[0].prompt_ids
        prompt_ids[i, p_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[i, p_len - len(ids) :] = 1
    episodes = [e for g in groups for e in g]
    c_len = max(len(e.completion_ids) for e in episodes)
    n = len(episodes)
    completion_ids = torch.full((n, c_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, c_len), dtype=torch.long)
    loss_mask = torch.zeros((n, c_len), dtype=torch.float32)
    engine_logprobs = torch.zeros((n, c_len), dtype=torch.float32)
    for j, e in enumerate(episodes):
        k = len(e.completion_ids)
        completion_ids[j, :k] = torch.tensor(e.completion_ids, dtype=torch.long)
        completion_mask[j, :k] = 1
        loss_mask[j, :k] = torch.tensor(e.loss_mask, dtype=torch.float32)
        engine_logprobs[j, :k] = torch.tensor(e.engine_logprobs, dtype=torch.float32)
    adv = torch.tensor([a for row in advantages for a in row], dtype=torch.float32)
    return GroupBatch(
        prompt_ids, prompt_mask, completion_ids, completion_mask, loss_mask, engine_logprobs, adv, group_size
    )
