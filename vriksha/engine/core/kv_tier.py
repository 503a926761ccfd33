"""A second KV tier below the pool: the K/V of evicted prefixes, kept in host memory and loaded back on a hit.

The radix tree decides what moves (its nodes say which tier holds their K/V); this tier only stores and copies.
`int8` keeps a quarter of fp32's bytes: each token's head vector is scaled by its own absolute maximum / 127
(one fp32 scale per token, head and layer, so a node splits at any token); `float32` keeps the pool's values
exactly (a pool in bf16 or fp16 round-trips through fp32 unchanged), for checking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import vriksha.device as devices
from vriksha.engine.core.kv_pool import KVPool
from vriksha.errors import ConfigError

TIER_DTYPES = ("int8", "float32")


@dataclass(slots=True)
class HostKV:
    """One node's K/V in the tier: per layer, K and V as int8 with scales, or as fp32 (scales None)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    k_scale: list[torch.Tensor] | None
    v_scale: list[torch.Tensor] | None
    num_tokens: int

    def slice(self, start: int, end: int) -> HostKV:
        def part(xs: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            return None if xs is None else [x[start:end] for x in xs]

        k, v = part(self.k), part(self.v)
        assert k is not None and v is not None
        return HostKV(k, v, part(self.k_scale), part(self.v_scale), end - start)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [tokens, heads, dim] -> int8 values and fp32 scales [tokens, heads, 1] (x ~= q * scale)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8), scale


@dataclass(slots=True)
class TierCounters:
    written_tokens: int = 0  # tokens moved from the pool to the tier (evicted, kept)
    loaded_tokens: int = 0  # tokens copied back into the pool on a hit (not recomputed)
    dropped_tokens: int = 0  # tokens that left the tier for good (its own LRU, a flush)


class KVTier:
    def __init__(self, pool: KVPool, capacity_tokens: int, dtype: str = "int8") -> None:
        if dtype not in TIER_DTYPES:
            raise ConfigError(f"the KV tier's dtype must be int8 or float32, got {dtype!r}")
        if capacity_tokens < 1:
            raise ConfigError(f"the KV tier needs at least 1 token, got {capacity_tokens}; 0 turns it off")
        self.pool = pool
        self.capacity = capacity_tokens
        self.dtype = dtype
        self.used = 0
        self.counters = TierCounters()

    @property
    def medium(self) -> str:
        return f"cpu-{self.dtype}"

    @property
    def num_free(self) -> int:
        return self.capacity - self.used

    def store(self, slots: torch.Tensor) -> HostKV:
        """Copy the K/V at `slots` out of the pool (the caller checked there is room and frees the slots)."""
        n = slots.numel()
        host = devices.host()
        ks, vs = [], []
        k_scales: list[torch.Tensor] = []
        v_scales: list[torch.Tensor] = []
        for layer in range(self.pool.num_layers):
            k = self.pool.k[layer].index_select(0, slots).to(host)
            v = self.pool.v[layer].index_select(0, slots).to(host)
            if self.dtype == "int8":
                (kq, ks_), (vq, vs_) = quantize(k), quantize(v)
                ks.append(kq), vs.append(vq), k_scales.append(ks_), v_scales.append(vs_)
            else:
                ks.append(k.float()), vs.append(v.float())
        self.used += n
        self.counters.written_tokens += n
        scaled = self.dtype == "int8"
        return HostKV(ks, vs, k_scales if scaled else None, v_scales if scaled else None, n)

    def load(self, host: HostKV, slots: torch.Tensor) -> None:
        """Write `host` into the pool at `slots` and let it go from the tier."""
        pool = self.pool
        for layer in range(pool.num_layers):
            k, v = host.k[layer], host.v[layer]
            if host.k_scale is not None and host.v_scale is not None:
                k = k.float() * host.k_scale[layer]
                v = v.float() * host.v_scale[layer]
            pool.k[layer].index_copy_(0, slots, k.to(pool.device, pool.dtype))
            pool.v[layer].index_copy_(0, slots, v.to(pool.device, pool.dtype))
        self.used -= host.num_tokens
        self.counters.loaded_tokens += host.num_tokens

    def drop(self, host: HostKV) -> None:
        """`host` leaves the tier without being loaded."""
        self.used -= host.num_tokens
        self.counters.dropped_tokens += host.num_tokens

    def forget(self, host: HostKV) -> None:
        """`host` was replaced by K/V computed again in the pool (an insert reached it first)."""
        self.used -= host.num_tokens
