"""Log-probabilities of completion tokens, computed with the prompt run once per group.

Two forwards through the (possibly FSDP-sharded) model: the group's prompts with a KV cache,
keeping only the last prompt position's logits; the cache is repeated for the group's
completions, whose forward attends to it. Gradients flow through the shared prompt KV, so the
result (and its gradient) equals running every prompt+completion sequence on its own, at a
fraction of the tokens. Logits are only ever formed on completion positions. With a
tensor-parallel head the logits stay split over the vocabulary (see `vocab_parallel.py`).

The completion forward stops short of the LM head: the head and the log-softmax then run on
`chunk_tokens` positions at a time under activation checkpointing, so the `[tokens, vocab]` fp32
logits (with their softmax and gradient copies, four times that) exist for one chunk at a time,
in the forward and again in the backward (which recomputes a chunk's logits from its hidden
states). The result and its gradient equal the one-piece computation within rounding.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vriksha.train.batch import GroupBatch
from vriksha.train.vocab_parallel import VocabShard, local_logits, sharded_token_logprobs

__all__ = ["CompletionLogprobs", "completion_logprobs", "DEFAULT_CHUNK_TOKENS"]

DEFAULT_CHUNK_TOKENS = 512  # 512 x 49,152 fp32 logits: 96 MiB per copy

_CACHE_KWARG: dict[type, str] = {}


def _cache_kwarg(model: nn.Module) -> str:
    """Transformers >= 5.2x calls the KV cache argument `cache`; earlier releases `past_key_values`."""
    cls = type(model)
    if cls not in _CACHE_KWARG:
        params = inspect.signature(model.forward).parameters
        _CACHE_KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARG[cls]


@dataclass(slots=True)
class CompletionLogprobs:
    logprobs: Tensor  # [B, C] log pi(token) of each completion token (garbage on padding)
    entropy: Tensor | None  # [B, C] entropy of the predictive distribution (no grad)


def _token_logprobs(
    logits: Tensor, targets: Tensor, with_entropy: bool, shard: VocabShard | None = None
) -> tuple[Tensor, Tensor | None]:
    if shard is not None:  # a tensor-parallel head: this rank's slice of the vocabulary
        return sharded_token_logprobs(logits, targets, shard, with_entropy)
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            ent = lse - (probs * logits).sum(-1)
    return lp, ent


@contextlib.contextmanager
def _head_input(model: nn.Module) -> Iterator[list[Tensor]]:
    """While active, the model's LM head sees only the last position of its input; the full
    input (the final hidden states) is kept in the yielded list. The hook runs before any
    tensor-parallel input hook of the head, so it sees a plain tensor."""
    head = model.get_output_embeddings()
    box: list[Tensor] = []

    def keep(module: nn.Module, args: tuple) -> tuple:
        box.append(args[0])
        return (args[0][..., -1:, :], *args[1:])

    handle = head.register_forward_pre_hook(keep, prepend=True)
    try:
        yield box
    finally:
        handle.remove()


def _chunked_logprobs(
    head: nn.Module, hidden: Tensor, targets: Tensor, with_entropy: bool, chunk_tokens: int
) -> tuple[Tensor, Tensor | None]:
    """`_token_logprobs(head(hidden), targets)` over `chunk_tokens` positions at a time, each chunk
    checkpointed: only its hidden states are kept for the backward, which recomputes its logits.
    The entropy (no gradient) is taken on the first pass only."""
    step = max(1, chunk_tokens // max(1, hidden.shape[0]))
    grad = torch.is_grad_enabled()
    lps: list[Tensor] = []
    ents: list[Tensor] = []
    for s in range(0, hidden.shape[1], step):
        first = [True]

        def piece(h: Tensor, t: Tensor, first: list[bool] = first) -> Tensor:
            logits, shard = local_logits(head(h))
            lp, ent = _token_logprobs(logits, t, with_entropy and first[0], shard)
            if ent is not None:
                ents.append(ent)
            first[0] = False
            return lp

        h, t = hidden[:, s : s + step], targets[:, s : s + step]
        lps.append(checkpoint(piece, h, t, use_reentrant=False) if grad else piece(h, t))
    return torch.cat(lps, dim=1), torch.cat(ents, dim=1) if with_entropy else None


def completion_logprobs(
    model: nn.Module, batch: GroupBatch, with_entropy: bool = False, chunk_tokens: int | None = None
) -> CompletionLogprobs:
    """`chunk_tokens`: positions x sequences per LM-head chunk (None: `DEFAULT_CHUNK_TOKENS`;
    0: the whole completion at once)."""
    chunk_tokens = DEFAULT_CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    g = batch.group_size
    cache_kw = _cache_kwarg(model)
    prompt_pos = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=prompt_pos,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(out, "cache", None) or out.past_key_values
    cache.batch_repeat_interleave(g)
    logits, shard = local_logits(out.logits)
    first_logits = logits[:, -1].repeat_interleave(g, dim=0)  # predicts completion token 0
    c_len = batch.completion_ids.shape[1]
    lp0, ent0 = _token_logprobs(first_logits, batch.completion_ids[:, 0], with_entropy, shard)
    if c_len == 1:
        return CompletionLogprobs(lp0[:, None], ent0[:, None] if ent0 is not None else None)
    attn = torch.cat([batch.prompt_mask.repeat_interleave(g, dim=0), batch.completion_mask], dim=1)
    start = batch.prompt_mask.sum(-1).repeat_interleave(g, dim=0)
    pos = start[:, None] + torch.arange(c_len - 1, device=start.device)[None]
    targets = batch.completion_ids[:, 1:]
    chunked = chunk_tokens > 0 and targets.numel() > chunk_tokens
    with _head_input(model) if chunked else contextlib.nullcontext([]) as hidden:
        out2 = model(
            input_ids=batch.completion_ids[:, :-1],
            attention_mask=attn[:, :-1],
            position_ids=pos,
            use_cache=True,
            **{cache_kw: cache},
        )
    if chunked:
        head = model.get_output_embeddings()
        lps, ents = _chunked_logprobs(head, hidden[0], targets, with_entropy, chunk_tokens)
    else:
        logits, shard = local_logits(out2.logits)
        lps, ents = _token_logprobs(logits, targets, with_entropy, shard)
    logprobs = torch.cat([lp0[:, None], lps], dim=1)
    entropy = torch.cat([ent0[:, None], ents], dim=1) if with_entropy else None
    return CompletionLogprobs(logprobs, entropy)
