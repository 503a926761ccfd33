"""One forward for sampling and for training, so that both compute the same log-probs bit for bit
(`grpo.on_policy: exact`).

A floating-point result depends on the order of its reductions, and kernels choose that order from the
shapes they are given: the same row's logits differ in their last bits between a batch of 3 rows and one of
7, or between a prompt run at once and one token at a time. So the engine and the trainer run a group the
same way, call for call: the prompt alone, `[1, P]`, into a Transformers KV cache (the last position's logits
only), the cache repeated for the group's `G` completions, then one `[G, 1]` forward per completion position.
The engine samples token t from the logits of call t and reports `token_logprobs` of them; the trainer feeds
the sampled tokens through the same calls (with autograd on) and takes the same `token_logprobs`. Same
module, parameters, dtype, shapes and call order: the same bits. A completion that ended early is fed
padding while its group runs on; a row never reads another row, so what it is fed changes nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vriksha.train.batch import GroupBatch
from vriksha.train.logprobs import CompletionLogprobs, _cache_kwarg, _token_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["LockstepForward", "lockstep_logprobs", "token_logprobs"]


def token_logprobs(
    logits: Tensor, targets: Tensor, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits)[target] in float32 (and the entropy): the trainer's formula, used by both sides."""
    return _token_logprobs(logits, targets, with_entropy)


class LockstepForward:
    """A group's forwards, one call at a time: `start(prompt, rows)`, then `step(tokens)` per position;
    each returns the logits [rows, vocab] that predict the next token."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache: Any = None
        self.position = 0
        self.rows = 0

    def start(self, prompt_ids: Tensor, rows: int) -> Tensor:
        """`prompt_ids` [P] (no padding); the logits of its last position, repeated for `rows` completions."""
        ids = prompt_ids.view(1, -1)
        out = self.model(
            input_ids=ids,
            position_ids=torch.arange(ids.shape[1], device=ids.device)[None],
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = getattr(out, "cache", None) or out.past_key_values
        self.cache.batch_repeat_interleave(rows)
        self.position, self.rows = ids.shape[1], rows
        return out.logits[:, -1].expand(rows, -1)

    def step(self, tokens: Tensor) -> Tensor:
        """`tokens` [rows]: each row's token at the current position; the logits for the next."""
        position = torch.full((self.rows, 1), self.position, dtype=torch.long, device=tokens.device)
        out = self.model(
            input_ids=tokens.view(self.rows, 1),
            position_ids=position,
            use_cache=True,
            **{_cache_kwarg(self.model): self.cache},
        )
        self.position += 1
        return out.logits[:, -1]


def lockstep_logprobs(
    model: PreTrainedModel,
    batch: GroupBatch,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    **_: Any,
) -> CompletionLogprobs:
    """`completion_logprobs` computed group by group in the engine's lockstep calls (see the module doc):
    [g * G, C] log-probs (garbage on padding) and entropies; gradients flow through every call."""
    g, c_len = batch.group_size, batch.completion_ids.shape[1]
    lps: list[Tensor] = []
    ents: list[Tensor] = []
    for group in range(batch.prompt_ids.shape[0]):
        prompt = batch.prompt_ids[group][batch.prompt_mask[group].bool()]
        rows = batch.completion_ids[group * g : (group + 1) * g]
        # the engine ran until its longest completion ended: as many calls here
        length = max(1, int(((batch.completion_mask[group * g : (group + 1) * g] > 0).sum(-1)).max()))
        forward = LockstepForward(model)
        logits = forward.start(prompt, g)
        steps: list[tuple[Tensor, Tensor | None]] = []
        for t in range(length):
            lp, ent = _token_logprobs(logits, rows[:, t], with_entropy, entropy_grad=entropy_grad)
            steps.append((lp, ent))
            if t + 1 < length:
                logits = forward.step(rows[:, t])
        pad = c_len - length
        lps.append(_padded(torch.stack([s[0] for s in steps], dim=1), pad))
        if with_entropy:
            ents.append(_padded(torch.stack([s[1] for s in steps], dim=1), pad))  # type: ignore[misc]
    entropy = torch.cat(ents) if with_entropy else None
    return CompletionLogprobs(torch.cat(lps), entropy)


def _padded(x: Tensor, pad: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, pad)) if pad else x
