"""Log-probabilities of completion tokens, computed with the prompt run once per group.

Two forwards through the (possibly FSDP-sharded) model: the group's prompts with a KV cache,
keeping only the last prompt position's logits; the cache is repeated for the group's
completions, whose forward attends to it. Gradients flow through the shared prompt KV, so the
result (and its gradient) equals running every prompt+completion sequence on its own, at a
fraction of the tokens. Logits are only ever formed on completion positions. With a
tensor-parallel head the logits stay split over the vocabulary (see `vocab_parallel.py`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vriksha.train.batch import GroupBatch
from vriksha.train.vocab_parallel import VocabShard, local_logits, sharded_token_logprobs

__all__ = ["CompletionLogprobs", "completion_logprobs"]

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


def completion_logprobs(
    model: nn.Module, batch: GroupBatch, with_entropy: bool = False
) -> CompletionLogprobs:
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
    out2 = model(
        input_ids=batch.completion_ids[:, :-1],
        attention_mask=attn[:, :-1],
        position_ids=pos,
        use_cache=True,
        **{cache_kw: cache},
    )
    logits, shard = local_logits(out2.logits)
    lps, ents = _token_logprobs(logits, batch.completion_ids[:, 1:], with_entropy, shard)
    logprobs = torch.cat([lp0[:, None], lps], dim=1)
    entropy = torch.cat([ent0[:, None], ents], dim=1) if with_entropy else None
    return CompletionLogprobs(logprobs, entropy)
