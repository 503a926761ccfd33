"""One attention backend interface, and the choice of a backend for a kernel set and a KV pool dtype.

A backend attends one layer's queries over the KV pool for a whole engine batch: the decode rows (one query
per request, over that request's cached tokens) and each prefill chunk (its queries over its cached prefix
and itself, causally). The choice depends only on what the kernel set offers for the pool's dtype, so it is
made once at load (`select_backend`): `GatheringAttention` (torch: gather K/V, then SDPA),
`PoolDecodeAttention` (decode rows by the kernel set's kernel reading the pool in place),
`PoolPrefillAttention` (prefill chunks by its in-place kernel) or `PoolAttention` (both). Layers with terms
SDPA cannot express (soft-capping, attention sinks) take `ExplicitSoftmaxAttention`, whatever the backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vriksha.engine.attention.batch import AttentionBatch

# (q [B, H, D] in the pool's dtype, k_pool, v_pool, slots [B, Lmax], lens [B], scale, window) -> [B, H, Dv]
DecodeKernel = Callable[..., torch.Tensor]
# (q [T, H, D] float32, k_pool, v_pool, slots [L], scale) -> [T, H, Dv] float32, or None where it declines
PrefillKernel = Callable[..., "torch.Tensor | None"]


@dataclass(slots=True)
class LayerCall:
    """One layer's attention inside an engine forward: its queries (RoPE applied) and the new tokens' K/V."""

    layer: int
    query: torch.Tensor  # [1, H, T, D]
    key: torch.Tensor  # [1, Hkv, T, D]
    value: torch.Tensor  # [1, Hkv, T, Dv]
    scaling: float | None  # as the layer gives it (None: 1 / sqrt(D))
    window: int | None  # sliding window, or None
    k_pool: torch.Tensor  # [slots, Hkv, D]: this layer's K in the pool, the new tokens' written
    v_pool: torch.Tensor  # [slots, Hkv, Dv]

    @property
    def num_heads(self) -> int:
        return self.query.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.key.shape[1]

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.query.shape[-1]

    @property
    def scale(self) -> float:
        return self.scaling if self.scaling is not None else self.head_dim**-0.5


class AttentionBackend(ABC):
    """Attends a layer's queries over the pool: `decode` for the decode rows, `prefill` per prefill chunk."""

    name: str = "attention"
    decode_kernel: DecodeKernel | None = None  # a decode kernel reading the pool in place, if any
    prefill_kernel: PrefillKernel | None = None

    def attend(self, call: LayerCall, batch: AttentionBatch, out: torch.Tensor) -> None:
        """Write the attention output of every token of the batch into `out` [T, H, Dv]."""
        if batch.num_decode:
            out[: batch.num_decode] = self.decode(call, batch)
        for index, seg in enumerate(batch.prefills):
            out[seg.q_start : seg.q_start + seg.q_len] = self.prefill(call, batch, index)

    @abstractmethod
    def decode(self, call: LayerCall, batch: AttentionBatch) -> torch.Tensor:
        """[B, H, Dv]: the first `batch.num_decode` queries over their requests' cached tokens."""

    @abstractmethod
    def prefill(self, call: LayerCall, batch: AttentionBatch, index: int) -> torch.Tensor:
        """[q_len, H, Dv]: prefill segment `index`'s queries over its prefix and itself, causally."""

    def describe(self) -> str:
        return self.name


def select_backend(kernels, pool_dtype: torch.dtype) -> AttentionBackend:
    """The backend for a kernel set (`platform/kernel_sets.py`) over a pool of `pool_dtype`."""
    from vriksha.engine.attention.gathering import GatheringAttention
    from vriksha.engine.attention.pool_kernels import (
        PoolAttention,
        PoolDecodeAttention,
        PoolPrefillAttention,
    )

    decode = kernels.decode_attention_for(pool_dtype)
    prefill = kernels.prefill_attention_for(pool_dtype)
    if decode is not None and prefill is not None:
        return PoolAttention(kernels.name, decode, prefill)
    if decode is not None:
        return PoolDecodeAttention(kernels.name, decode)
    if prefill is not None:
        return PoolPrefillAttention(kernels.name, prefill=prefill)
    return GatheringAttention()
