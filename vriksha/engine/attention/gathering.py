"""torch's attention over the KV pool: each request's K/V gathered from its slots, then SDPA.

Decode rows run as one padded SDPA call (keys past a row's length masked); a prefill chunk with no cached
prefix attends its own new K/V causally, one with a prefix gathers the prefix and itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vriksha.engine.attention.backend import AttentionBackend, DecodeKernel, LayerCall, PrefillKernel
from vriksha.engine.attention.batch import AttentionBatch, PrefillSegment


def gather_decode_kv(call: LayerCall, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode rows' K/V [B, Hkv, Lmax, D] from their slots (padded columns read slot 0)."""
    b, hkv = batch.num_decode, call.num_kv_heads
    flat = batch.decode_kv_slots.view(
        -1
    )  # index_select: aten::index is far slower on the CPU for this gather
    k = call.k_pool.index_select(0, flat).view(b, -1, hkv, call.head_dim).transpose(1, 2)
    v = call.v_pool.index_select(0, flat).view(b, -1, hkv, call.v_pool.shape[-1]).transpose(1, 2)
    return k, v


def gather_prefill_kv(call: LayerCall, seg: PrefillSegment) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill chunk's K/V [1, Hkv, prefix + q_len, D] from its slots."""
    k = call.k_pool.index_select(0, seg.kv_slots).transpose(0, 1).unsqueeze(0)
    v = call.v_pool.index_select(0, seg.kv_slots).transpose(0, 1).unsqueeze(0)
    return k, v


def decode_queries(call: LayerCall, b: int) -> torch.Tensor:
    """The decode rows' queries grouped by KV head: [B, Hkv, group, D]."""
    q = call.query[0, :, :b].transpose(0, 1)
    return q.reshape(b, call.num_kv_heads, call.group, call.head_dim)


class GatheringAttention(AttentionBackend):
    name = "torch SDPA over gathered K/V"

    def __init__(
        self,
        kernels: str = "torch",
        decode: DecodeKernel | None = None,
        prefill: PrefillKernel | None = None,
    ) -> None:
        self.kernels = kernels
        self.decode_kernel = decode
        self.prefill_kernel = prefill

    def decode(self, call: LayerCall, batch: AttentionBatch) -> torch.Tensor:
        b = batch.num_decode
        k, v = gather_decode_kv(call, batch)
        q = decode_queries(call, b).to(k.dtype)
        o = self.decode_rows(call, q, k, v, batch.decode_mask(call.window))  # [B, Hkv, G, Dv]
        return o.reshape(b, call.num_heads, v.shape[-1])

    def decode_rows(self, call: LayerCall, q, k, v, mask: torch.Tensor) -> torch.Tensor:
        """q [B, Hkv, G, D] over gathered k/v [B, Hkv, Lmax, D], `mask` [B, 1, 1, Lmax]."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=call.scaling)

    def prefill(self, call: LayerCall, batch: AttentionBatch, index: int) -> torch.Tensor:
        seg = batch.prefills[index]
        s, n = seg.q_start, seg.q_len
        q = call.query[:, :, s : s + n]
        mask = batch.prefill_mask(index, call.window)
        gqa = call.group > 1
        if mask is None:  # no cached prefix, no window: the chunk's own K/V, plain causal
            k, v = call.key[:, :, s : s + n], call.value[:, :, s : s + n]
            pool_dtype = call.k_pool.dtype
            if (
                pool_dtype != q.dtype
            ):  # a bf16 pool under an fp32 model: attend over K/V as the pool keeps them
                q, k, v = q.to(pool_dtype), k.to(pool_dtype), v.to(pool_dtype)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=call.scaling, enable_gqa=gqa)
        else:
            k, v = gather_prefill_kv(call, seg)
            o = F.scaled_dot_product_attention(
                q.to(k.dtype), k, v, attn_mask=mask, scale=call.scaling, enable_gqa=gqa
            )
        return o[0].transpose(0, 1)

    def describe(self) -> str:
        return f"{self.name} (kernel set {self.kernels})"
