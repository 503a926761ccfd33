"""The engine's attention, registered with Transformers' AttentionInterface.

The model runs one flattened ragged batch ([1, T] tokens, no padding computed). For each layer this function
writes the new tokens' K/V into the pool, then attends each request's queries over that request's cached
tokens: decode tokens (one query each) in one call (the kernel set's decode attention reading the pool in
place where it has one for the pool's dtype, else one padded SDPA over gathered K/V), prefill chunks one SDPA call per request. Layers with terms SDPA cannot express (logit soft-capping, attention
sinks) take an explicit softmax over the same K/V. The batch layout is published by the model runner through `forward_context` before the forward pass.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from vriksha.engine.core.kv_layout import LayoutProbe
from vriksha.engine.core.kv_pool import KVPool

ATTENTION_NAME = "vriksha_paged"


@dataclass(slots=True)
class PrefillSegment:
    q_start: int  # offset of this request's new tokens in the flattened batch
    q_len: int
    prefix_len: int  # tokens already in the KV pool before this chunk
    kv_slots: torch.Tensor  # [prefix_len + q_len] slots of every token the chunk attends to


@dataclass(slots=True)
class AttentionBatch:
    pool: KVPool
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    num_decode: int  # the first num_decode tokens are decode tokens, one per request
    decode_kv_slots: torch.Tensor | None = None  # [B, Lmax], padded with slot 0
    decode_kv_lens: torch.Tensor | None = None  # [B]
    prefills: list[PrefillSegment] = field(default_factory=list)
    decode_kernel: Callable | None = None  # the kernel set's decode attention over the pool in place
    prefill_kernel: Callable | None = None  # its causal attention of a prompt chunk over the pool in place
    _masks: dict = field(default_factory=dict)

    def decode_mask(self, window: int | None) -> torch.Tensor:
        """[B, 1, 1, Lmax] bool: which padded key positions each decode query attends to."""
        key = ("decode", window)
        if key not in self._masks:
            lens = self.decode_kv_lens
            pos = torch.arange(self.decode_kv_slots.shape[1], device=lens.device)
            mask = pos[None, :] < lens[:, None]
            if window is not None:
                mask &= pos[None, :] > (lens[:, None] - 1 - window)
            self._masks[key] = mask[:, None, None, :]
        return self._masks[key]

    def prefill_mask(self, index: int, window: int | None) -> torch.Tensor | None:
        """[q_len, prefix_len + q_len] bool causal mask with an offset, or None when plain causal applies."""
        seg = self.prefills[index]
        if seg.prefix_len == 0 and window is None:
            return None
        key = ("prefill", index, window)
        if key not in self._masks:
            device = seg.kv_slots.device
            q_pos = torch.arange(seg.q_len, device=device)[:, None] + seg.prefix_len
            k_pos = torch.arange(seg.prefix_len + seg.q_len, device=device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= k_pos > q_pos - window
            self._masks[key] = mask
        return self._masks[key]


class _Context(threading.local):
    """The batch of the engine forward running in this thread: per thread, so that an engine's forward
    and a plain forward (training, another engine) in other threads of the process never see it."""

    batch: AttentionBatch | LayoutProbe | None = None


_context = _Context()


@contextlib.contextmanager
def forward_context(batch: AttentionBatch | LayoutProbe) -> Iterator[None]:
    previous, _context.batch = _context.batch, batch
    try:
        yield
    finally:
        _context.batch = previous


def _layer_window(module: torch.nn.Module, kwargs: dict) -> int | None:
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    return int(window) if window else None


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, T, D] (RoPE applied)
    key: torch.Tensor,  # [1, Hkv, T, D]
    value: torch.Tensor,  # [1, Hkv, T, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    batch = _context.batch
    if batch is None or isinstance(batch, LayoutProbe):
        # a forward outside the engine (training, a plain HF call) behaves exactly like the family's own attention
        if isinstance(batch, LayoutProbe):
            batch.record(module.layer_idx, key, value)
        return _reference_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    extras = _Extras.of(module, kwargs)
    layer = module.layer_idx
    pool = batch.pool
    num_heads, num_kv_heads = query.shape[1], key.shape[1]
    group = num_heads // num_kv_heads
    head_dim, v_dim = query.shape[-1], value.shape[-1]
    k_new = key[0].transpose(0, 1)  # [T, Hkv, D]
    v_new = value[0].transpose(0, 1)
    pool.write(layer, batch.slot_mapping, k_new, v_new)
    window = _layer_window(module, kwargs)
    total = query.shape[2]
    out = query.new_empty(total, num_heads, v_dim)
    k_pool, v_pool = pool.k[layer], pool.v[layer]

    if batch.num_decode and batch.decode_kernel is not None and extras is None:
        b = batch.num_decode
        q = query[0, :, :b].transpose(0, 1).to(k_pool.dtype).contiguous()  # [B, H, D]
        scale = scaling if scaling is not None else head_dim**-0.5
        out[:b] = batch.decode_kernel(
            q, k_pool, v_pool, batch.decode_kv_slots, batch.decode_kv_lens, scale, window
        )
    elif batch.num_decode:
        b = batch.num_decode
        q = query[0, :, :b].transpose(0, 1).reshape(b, num_kv_heads, group, head_dim)
        slots = batch.decode_kv_slots
        flat = slots.view(-1)  # index_select: aten::index is far slower on the CPU for this gather
        k = k_pool.index_select(0, flat).view(b, -1, num_kv_heads, head_dim).transpose(1, 2)  # [B, Hkv, L, D]
        v = v_pool.index_select(0, flat).view(b, -1, num_kv_heads, v_dim).transpose(1, 2)
        if extras is None:
            o = F.scaled_dot_product_attention(
                q.to(k.dtype), k, v, attn_mask=batch.decode_mask(window), scale=scaling
            )  # [B, Hkv, G, D]
        else:
            sinks = None if extras.sinks is None else extras.sinks.view(1, num_kv_heads, group, 1)
            o = extras.attend(q.to(k.dtype), k, v, batch.decode_mask(window), scaling, sinks)
        out[:b] = o.reshape(b, num_heads, v_dim).to(out.dtype)

    for i, seg in enumerate(batch.prefills):
        s, n = seg.q_start, seg.q_len
        q = query[:, :, s : s + n]
        if batch.prefill_kernel is not None and extras is None and window is None:
            scale = scaling if scaling is not None else head_dim**-0.5
            q_rows = q[0].transpose(0, 1).float().contiguous()  # [T, H, D]
            o = batch.prefill_kernel(q_rows, k_pool, v_pool, seg.kv_slots, scale)
            if o is not None:
                out[s : s + n] = o.to(out.dtype)
                continue
        mask = batch.prefill_mask(i, window)
        if extras is not None:
            k = k_pool.index_select(0, seg.kv_slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            v = v_pool.index_select(0, seg.kv_slots).transpose(0, 1).unsqueeze(0)
            if mask is None:
                mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            sinks = None if extras.sinks is None else extras.sinks.view(1, num_heads, 1, 1)
            o = extras.attend(
                q.to(k.dtype),
                k.repeat_interleave(group, 1),
                v.repeat_interleave(group, 1),
                mask,
                scaling,
                sinks,
            )
        elif mask is None:
            k, v = key[:, :, s : s + n], value[:, :, s : s + n]
            if (
                k_pool.dtype != q.dtype
            ):  # a bf16 pool under an fp32 model: attend over K/V as the pool keeps them
                q, k, v = q.to(k_pool.dtype), k.to(k_pool.dtype), v.to(k_pool.dtype)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=group > 1)
        else:
            k = k_pool.index_select(0, seg.kv_slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            v = v_pool.index_select(0, seg.kv_slots).transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                q.to(k.dtype), k, v, attn_mask=mask, scale=scaling, enable_gqa=group > 1
            )
        out[s : s + n] = o[0].transpose(0, 1).to(out.dtype)
    return out.unsqueeze(0), None


@dataclass(slots=True)
class _Extras:
    """Terms SDPA cannot express: tanh soft-capping of the logits (Gemma 2) and per-head attention sinks
    (a learned logit that takes part in the softmax and is then dropped, GPT-OSS)."""

    softcap: float | None
    sinks: torch.Tensor | None  # [H]

    @classmethod
    def of(cls, module: torch.nn.Module, kwargs: dict) -> _Extras | None:
        softcap = kwargs.get("softcap") or getattr(module, "attn_logit_softcapping", None)
        sinks = kwargs.get("s_aux")
        if sinks is None:
            sinks = getattr(module, "sinks", None)
        if not softcap and sinks is None:
            return None
        return cls(float(softcap) if softcap else None, sinks)

    def attend(self, q, k, v, mask, scale, sinks) -> torch.Tensor:
        """q [.., Tq, D], k/v [.., Tk, D] with matching heads; mask bool, broadcastable to [.., Tq, Tk]."""
        scale = scale if scale is not None else q.shape[-1] ** -0.5
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            sink = sinks.float().expand(*scores.shape[:-1], 1)
            scores = torch.cat([scores, sink], dim=-1)
            probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs.to(v.dtype), v)


def _reference_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    """The attention the family itself would run: SDPA, or its eager code where it has terms SDPA lacks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _Extras.of(module, kwargs) is not None:
        forward = getattr(inspect.getmodule(type(module)), "eager_attention_forward", None)
        if forward is not None:
            return forward(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )


def _mask(*args, **kwargs):
    if _context.batch is not None:
        return None  # the engine builds its own masks from the batch layout
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register_attention() -> str:
    """Register the engine's attention and mask builder with Transformers; returns the name to select them.

    Outside an engine forward pass both behave exactly like Transformers' SDPA path, so a model the engine
    wraps in place still trains normally.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _mask)
    return ATTENTION_NAME
