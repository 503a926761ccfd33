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

Completions are right-padded to the micro-batch's longest, so one that ran to the token limit among
short ones makes every row pay for its length. On one process the rows then run as sub-batches of
similar length (`length_sub_batches`), each to its own longest row, on its own copy of the prompts'
KV (the prompt forward still runs once). Where other ranks' collectives must line up with this
rank's forwards (FSDP, tensor parallel), the ranks `agree` on one number of forwards, and a rank
that planned fewer splits its widest sub-batch again or runs one-position forwards counted zero;
without `agree`, a process among others runs the micro-batch in one piece.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vriksha.train.batch import GroupBatch
from vriksha.train.config import SUB_BATCH_OVERHEAD_TOKENS
from vriksha.train.vocab_parallel import VocabShard, local_logits, sharded_token_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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
def _head_input(model: PreTrainedModel) -> Iterator[list[Tensor]]:
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


def length_sub_batches(lengths: list[int], overhead_tokens: int) -> list[list[int]]:
    """The rows split into sub-batches of similar length, each costing its rows times its longest row plus
    `overhead_tokens` (a forward's fixed cost): the split of least total cost (rows sorted by length, cut
    where it pays). Longest sub-batch first; rows of length 0 are left out."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + (j - i) * lengths[order[i]] + overhead_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _splittable(cache: object) -> bool:
    """Whether each sub-batch can take its own copy of the prompts' KV cache: plain full-attention layers
    (keys and values only; other layer kinds keep state a shallow copy would share)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    return all(type(layer) is DynamicLayer for layer in layers)


def _with_other_ranks() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def grown_plan(plan: Sequence[list[int] | None], count: int) -> list[list[int] | None]:
    """`plan` made `count` forwards long, as another rank's plan needs: the sub-batch of most rows split in
    two (its longer rows first) while one has two rows, then None entries (a forward that counts zero)."""
    grown: list[list[int] | None] = list(plan)
    while len(grown) < count:
        widest = max(
            (i for i, rows in enumerate(grown) if rows is not None and len(rows) > 1),
            key=lambda i: len(grown[i] or ()),
            default=None,
        )
        if widest is None:
            grown.append(None)
            continue
        rows = grown[widest] or []
        grown[widest : widest + 1] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    return grown


def _cache_rows(cache: Any, rows: Tensor) -> Any:
    """A copy of `cache` holding the batch rows `rows` (repeats allowed), the original untouched."""
    sub = copy.copy(cache)
    sub.layers = [copy.copy(layer) for layer in cache.layers]
    sub.batch_select_indices(rows)
    return sub


def _completion_pass(
    model: PreTrainedModel,
    cache: Any,
    inputs: Tensor,
    attention_mask: Tensor,
    positions: Tensor,
    targets: Tensor,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of `targets`, the completions' next tokens, from one forward of `inputs`
    attending to the prompts' `cache`."""
    chunked = chunk_tokens > 0 and targets.numel() > chunk_tokens
    keeping: contextlib.AbstractContextManager[list[Tensor]] = (
        _head_input(model) if chunked else contextlib.nullcontext([])
    )
    with keeping as hidden:
        out = model(
            input_ids=inputs,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            **{_cache_kwarg(model): cache},
        )
    if chunked:
        return _chunked_logprobs(
            model.get_output_embeddings(), hidden[0], targets, with_entropy, chunk_tokens
        )
    logits, shard = local_logits(out.logits)
    return _token_logprobs(logits, targets, with_entropy, shard)


def completion_logprobs(
    model: PreTrainedModel,
    batch: GroupBatch,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    overhead_tokens: int = SUB_BATCH_OVERHEAD_TOKENS,
    agree: Callable[[int], int] | None = None,
) -> CompletionLogprobs:
    """`chunk_tokens`: positions x sequences per LM-head chunk (None: `DEFAULT_CHUNK_TOKENS`;
    0: the whole completion at once). `overhead_tokens`: what one more completion forward costs, in
    positions, when deciding whether completions of different lengths run apart (`length_sub_batches`).
    `agree`: where other ranks' collectives must line up with this one's forwards (FSDP, tensor
    parallel), the number of completion forwards every rank runs, given this rank's (the largest of
    all); without it, a process among others runs its completions in one forward."""
    chunk_tokens = DEFAULT_CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    g = batch.group_size
    prompt_pos = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=prompt_pos,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(out, "cache", None) or out.past_key_values
    logits, shard = local_logits(out.logits)
    first_logits = logits[:, -1].repeat_interleave(g, dim=0)  # predicts completion token 0
    n, c_len = batch.completion_ids.shape
    lp0, ent0 = _token_logprobs(first_logits, batch.completion_ids[:, 0], with_entropy, shard)
    prompt_mask = batch.prompt_mask.repeat_interleave(g, dim=0)
    start = batch.prompt_mask.sum(-1).repeat_interleave(g, dim=0)
    # each row's positions to run: up to its last real token (right-padded); the first comes from the prompt
    columns = torch.arange(1, c_len + 1, device=start.device)
    lengths = ((batch.completion_mask > 0) * columns).amax(-1) - 1
    splittable = _splittable(cache) and (agree is not None or not _with_other_ranks())
    plan: list[list[int] | None]
    if c_len == 1:
        plan = []
    elif splittable:
        plan = list(length_sub_batches(lengths.tolist(), overhead_tokens))
    else:
        plan = [list(range(n))]
    if agree is not None:
        plan = grown_plan(plan, agree(len(plan)))
    if len(plan) == 1 and plan[0] is not None:
        plan = [list(range(n))]  # one forward: every row, as the micro-batch is padded
    lps = first_logits.new_zeros((n, c_len - 1), dtype=torch.float32)
    ents = first_logits.new_zeros((n, c_len - 1), dtype=torch.float32) if with_entropy else None
    uncounted = first_logits.new_zeros((), dtype=torch.float32)
    for rows in plan:  # each sub-batch runs to its own longest row, not the micro-batch's
        if rows is None:  # another rank runs one more forward: one position of row 0, counted zero
            index, k = torch.zeros(1, dtype=torch.long, device=start.device), 1
            targets = batch.completion_ids[index, :1]
            completion_mask = torch.ones_like(targets)
        else:
            index = torch.tensor(rows, device=start.device)
            k = int(lengths[index].max())
            targets = batch.completion_ids[index, 1 : k + 1]
            completion_mask = batch.completion_mask[index, :k]
        if len(plan) > 1:
            sub_cache = _cache_rows(cache, index // g)
        else:  # the one forward: the prompts' cache itself
            sub_cache = cache
            if rows is None:  # a rank whose completions are one token long
                cache.batch_select_indices(index // g)
            else:
                cache.batch_repeat_interleave(g)
        pos = start[index, None] + torch.arange(k, device=start.device)[None]
        attn = torch.cat([prompt_mask[index], completion_mask], dim=1)
        lp, ent = _completion_pass(
            model,
            sub_cache,
            batch.completion_ids[index, :k],
            attn,
            pos,
            targets,
            with_entropy and rows is not None,
            chunk_tokens,
        )
        if rows is None:
            uncounted = uncounted + 0.0 * lp.sum()
            continue
        lps[index, :k] = lp.float()
        if ents is not None and ent is not None:
            ents[index, :k] = ent.float()
    logprobs = torch.cat([lp0[:, None], lps], dim=1) + uncounted
    entropy = torch.cat([ent0[:, None], ents], dim=1) if ent0 is not None and ents is not None else None
    return CompletionLogprobs(logprobs, entropy)
