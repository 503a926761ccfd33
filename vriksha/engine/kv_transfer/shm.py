"""Same-host K/V transfer through POSIX shared memory.

The source gathers the tokens' K/V from its pool straight into a shared-memory segment (one per transfer:
per layer, K as [tokens, kv_heads, k_dim] then V, back to back); the sink maps the segment and copies from
tensor views of it straight into its pool slots. No byte passes through a Python object. The source's
segments are registered with Python's resource tracker, so a source that dies (even by SIGKILL) leaves no
segment behind; the sink maps them untracked.
"""

from __future__ import annotations

import logging
import threading
import uuid
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import torch

from vriksha.engine.core.kv_layout import KVLayout
from vriksha.engine.kv_transfer.transport import (
    Descriptor,
    KVSink,
    KVSource,
    KVTransferError,
    SlotView,
    register,
    token_bytes,
)

logger = logging.getLogger(__name__)
_PREFIX = "vkv_"  # every segment a source makes; a sink maps no other


def _views(buf: memoryview, layout: KVLayout, dtype: torch.dtype, n: int) -> list[tuple[torch.Tensor, ...]]:
    """(K, V) tensor views of each layer's part of a segment holding `n` (>= 1) tokens."""
    out, offset = [], 0
    for layer in layout.layers:
        kb, vb = token_bytes(layer, dtype)
        k = torch.frombuffer(buf, dtype=torch.uint8, count=kb * n, offset=offset)
        offset += kb * n
        v = torch.frombuffer(buf, dtype=torch.uint8, count=vb * n, offset=offset)
        offset += vb * n
        shape_k, shape_v = (n, layer.kv_heads, layer.k_dim), (n, layer.kv_heads, layer.v_dim)
        out.append((k.view(dtype).view(shape_k), v.view(dtype).view(shape_v)))
    return out


def segment_size(layout: KVLayout, dtype: torch.dtype, n: int) -> int:
    return max(1, layout.bytes_per_token(dtype) * n)


class ShmSource(KVSource):
    name = "shm"
    holds_slots = False  # the K/V is copied into the segment: the pool's slots are free to go at once

    def __init__(self, **_: Any) -> None:
        self._segments: dict[str, shared_memory.SharedMemory] = {}
        self._lock = threading.Lock()

    def offer(self, transfer_id: str, kv: SlotView) -> dict[str, Any]:
        pool, n = kv.pool, kv.num_tokens
        name = f"{_PREFIX}{uuid.uuid4().hex[:20]}"
        seg = shared_memory.SharedMemory(
            name=name, create=True, size=segment_size(pool.layout, pool.dtype, n)
        )
        try:
            views = _views(seg.buf, pool.layout, pool.dtype, n)
            for layer, (k, v) in enumerate(views):
                kv.read_into(layer, k, v)
            del views, k, v  # release the exported buffer before the segment may be closed
        except BaseException:
            seg.close()
            seg.unlink()
            raise
        with self._lock:
            self._segments[transfer_id] = seg
        return {"name": name, "size": seg.size}

    def withdraw(self, transfer_id: str) -> None:
        with self._lock:
            seg = self._segments.pop(transfer_id, None)
        if seg is not None:
            seg.close()
            try:
                seg.unlink()
            except FileNotFoundError:
                pass

    def close(self) -> None:
        for transfer_id in list(self._segments):
            self.withdraw(transfer_id)

    @property
    def num_offers(self) -> int:
        return len(self._segments)


class ShmSink(KVSink):
    name = "shm"

    def __init__(self, **_: Any) -> None:
        pass

    def fetch(self, desc: Descriptor, begin: int, into: SlotView, timeout_s: float) -> None:
        name = str(desc.info.get("name", ""))
        if not name.startswith(_PREFIX) or "/" in name:
            raise KVTransferError(
                f"transfer {desc.transfer_id}: {name!r} is not a K/V segment of a prefill replica"
            )
        try:
            seg = shared_memory.SharedMemory(name=name)
        except (FileNotFoundError, ValueError) as exc:
            raise KVTransferError(
                f"the shared-memory segment {name!r} of transfer {desc.transfer_id} is gone (the prefill replica "
                "withdrew it after its hold timeout, or died)"
            ) from exc
        try:
            resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]  # the source owns it
        except Exception:  # noqa: BLE001 - trackers differ across Python versions; tracking is harmless
            pass
        try:
            pool, held = into.pool, desc.num_tokens - desc.start
            if seg.size < segment_size(pool.layout, pool.dtype, held):
                raise KVTransferError(f"transfer {desc.transfer_id}: the segment is smaller than its K/V")
            a = begin - desc.start
            b = a + into.num_tokens
            if a < 0 or b > held:
                raise KVTransferError(
                    f"transfer {desc.transfer_id} holds tokens {desc.start}..{desc.num_tokens}, "
                    f"not {begin}..{begin + into.num_tokens}"
                )
            views = _views(seg.buf, pool.layout, pool.dtype, held)
            for layer, (k, v) in enumerate(views):
                into.write(layer, k[a:b], v[a:b])
            del views, k, v
        finally:
            seg.close()


register("shm", ShmSource, ShmSink, same_host_only=True)
