"""Attention by the kernel set's kernels that read the KV pool in place (no gathered copy of K/V).

Which of them a kernel set has depends on the pool's dtype (`platform/kernel_sets.py`): the native sets a
decode kernel for float32 and bfloat16 pools and, on some CPUs, a prefill kernel; the triton set a decode
kernel. What a kernel does not cover (a sliding-window prefill, a chunk the prefill kernel declines) is
gathered and attended with SDPA, as `GatheringAttention` does.
"""

from __future__ import annotations

import torch

from vriksha.engine.attention.backend import LayerCall
from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.attention.gathering import GatheringAttention


class PoolDecodeAttention(GatheringAttention):
    """Decode rows by the kernel set's decode kernel over the pool in place; prefill chunks gathered."""

    name = "decode kernel over the pool in place"

    def decode(self, call: LayerCall, batch: AttentionBatch) -> torch.Tensor:
        b = batch.num_decode
        q = call.query[0, :, :b].transpose(0, 1).to(call.k_pool.dtype).contiguous()  # [B, H, D]
        slots, lens = batch.decode_kv_slots, batch.decode_kv_lens
        return self.decode_kernel(q, call.k_pool, call.v_pool, slots, lens, call.scale, call.window)


class PoolPrefillAttention(GatheringAttention):
    """Prefill chunks by the kernel set's causal kernel over the pool in place; decode rows gathered."""

    name = "prefill kernel over the pool in place"

    def prefill(self, call: LayerCall, batch: AttentionBatch, index: int) -> torch.Tensor:
        if call.window is None:
            seg = batch.prefills[index]
            s, n = seg.q_start, seg.q_len
            q_rows = call.query[0, :, s : s + n].transpose(0, 1).float().contiguous()  # [T, H, D]
            o = self.prefill_kernel(q_rows, call.k_pool, call.v_pool, seg.kv_slots, call.scale)
            if o is not None:
                return o
        return super().prefill(call, batch, index)


class PoolAttention(PoolDecodeAttention, PoolPrefillAttention):
    """Decode rows and prefill chunks both by the kernel set's kernels over the pool in place."""

    name = "decode and prefill kernels over the pool in place"
