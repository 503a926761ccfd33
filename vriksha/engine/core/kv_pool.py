"""Token-granular KV memory: one preallocated K and V tensor per layer, a slot allocator, a request-to-token table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import vriksha.device as devices
from vriksha.engine.core.kv_layout import KVLayout
from vriksha.errors import ConfigError
from vriksha.host_pages import drop_pages

if TYPE_CHECKING:
    from vriksha.engine.config import EngineConfig

DEFAULT_CPU_KV_GB = 1.0
DEFAULT_ACCEL_KV_FRACTION = 0.4


class SlotAllocator:
    """Hands out KV slot indices (one slot holds one token's K and V in every layer).

    Slot 0 is reserved as a scratch slot (padding writes land there), so usable slots are 1..num_slots-1.
    """

    def __init__(self, num_slots: int, device: torch.device | str | None = None) -> None:
        if num_slots < 2:
            raise ConfigError(
                f"the KV pool needs at least 2 slots, got {num_slots}; raise the KV memory budget"
            )
        self.num_slots = num_slots
        self.device = devices.resolve_or_host(device)
        self._free = torch.arange(1, num_slots, dtype=torch.int64, device=self.device)
        self._num_free = num_slots - 1

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def capacity(self) -> int:
        return self.num_slots - 1

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` free slots, or return None (taking nothing) when fewer are free."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        slots = self._free[start : self._num_free].clone()
        self._num_free = start
        return slots

    def free(self, slots: torch.Tensor) -> None:
        n = slots.numel()
        if n == 0:
            return
        if self._num_free + n > self.capacity:
            raise RuntimeError(
                f"KV slots freed twice: {self._num_free} + {n} free slots > capacity {self.capacity}"
            )
        self._free[self._num_free : self._num_free + n] = slots.to(self.device, torch.int64).flatten()
        self._num_free += n

    def free_slot_set(self) -> set[int]:
        return set(self._free[: self._num_free].tolist())


def _untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    drop_pages(t)
    return t


class KVPool:
    """K and V for every layer as [num_slots, kv_heads, k_dim] / [num_slots, kv_heads, v_dim] tensors, written in
    place by slot index; each layer shaped as its `LayerKV` says."""

    def __init__(
        self, layout: KVLayout, num_slots: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> None:
        self.layout = layout
        self.num_layers = layout.num_layers
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = devices.resolve_or_host(device)
        # on the host, zero without touching: only the pages of slots that get written become resident
        make = _untouched_zeros if devices.is_host(self.device) else torch.zeros
        self.k = [
            make((num_slots, x.kv_heads, x.k_dim), dtype=dtype, device=self.device) for x in layout.layers
        ]
        self.v = [
            make((num_slots, x.kv_heads, x.v_dim), dtype=dtype, device=self.device) for x in layout.layers
        ]
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    @property
    def moves_on_release(self) -> bool:
        """Whether `reacquire` puts the pool at new addresses (on an accelerator; on the host it stays)."""
        return not devices.is_host(self.device)

    def release(self) -> None:
        """Give every layer's K and V memory back: on an accelerator the storage is freed (the tensors, and views
        of them, stay with empty storage); on the host its pages are dropped (`drop_pages`), the addresses kept."""
        for t in (*self.k, *self.v):
            if self.moves_on_release:
                t.untyped_storage().resize_(0)
            else:
                drop_pages(t)
        self._released = True

    def reacquire(self) -> None:
        """The memory `release` gave back, zeroed: allocated again at new addresses on an accelerator; on the
        host the dropped pages already read as zero and come back as slots are written."""
        if self.moves_on_release:
            for t in (*self.k, *self.v):
                t.untyped_storage().resize_(t.numel() * t.element_size())
                t.zero_()
        self._released = False

    @property
    def nbytes(self) -> int:
        """The pool's memory when allocated."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @staticmethod
    def slots_for_budget(budget_bytes: int, layout: KVLayout, dtype: torch.dtype) -> int:
        return max(2, budget_bytes // layout.bytes_per_token(dtype))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [num_tokens, kv_heads, k_dim / v_dim] for the tokens at `slots`."""
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))


class ReqToTokenTable:
    """Row per running request: the KV slot of each of its tokens, in order."""

    def __init__(self, max_requests: int, max_context: int, device: torch.device | str | None = None) -> None:
        self.table = torch.zeros(
            (max_requests, max_context), dtype=torch.int64, device=devices.resolve_or_host(device)
        )
        self._free_rows = list(range(max_requests - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + slots.numel()] = slots

    def write_each(self, rows: list[int], positions: list[int], slots: torch.Tensor) -> None:
        """One slot per (row, position) pair."""
        self.table[rows, positions] = slots

    def read(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]


def kv_slots(config: EngineConfig, device: torch.device, layout: KVLayout, dtype: torch.dtype) -> int:
    """The KV pool's token slots on `device` (per rank under tensor parallel): `kv_cache_tokens` when given,
    else as many as the memory budget holds in `dtype`."""
    if config.kv_cache_tokens is not None:
        return config.kv_cache_tokens
    return KVPool.slots_for_budget(kv_budget_bytes(config, device), layout, dtype)


def kv_budget_bytes(config: EngineConfig, device: torch.device) -> int:
    """The KV pool's bytes on `device` (per rank under tensor parallel)."""
    if config.kv_cache_memory_gb is not None:
        return int(config.kv_cache_memory_gb * 2**30)
    if devices.is_host(device):
        return int(DEFAULT_CPU_KV_GB * 2**30)
    free = devices.free_memory_bytes(device)
    return int((free if free is not None else 2 * 2**30) * DEFAULT_ACCEL_KV_FRACTION)
