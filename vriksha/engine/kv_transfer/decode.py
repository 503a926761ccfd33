"""The decode replica's side of a transfer: find what of the prompt it lacks, have a prefill replica compute
and offer it, reserve slots, fetch the K/V into them and insert the prompt into the radix tree, so that the
request that follows finds it cached and only decodes.

While a transfer runs, its slots belong to it (the fourth owner beside the free list, a request and the
tree) and the cached prefix it extends is locked. Whatever happens (the prefill replica fails or dies, the
fetch times out, the caller goes away), the transfer ends either inserted into the tree or with its slots
freed and its lock dropped; it runs in a task of its own so that a cancelled caller cannot cut it short
while a fetch still writes into its slots.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from vriksha.engine.kv_transfer.prefill import EngineCall, radix_tree
from vriksha.engine.kv_transfer.transport import (
    Descriptor,
    KVSink,
    KVTransferError,
    SlotView,
    check_layout,
)

logger = logging.getLogger(__name__)


class PrefillPeer(Protocol):
    """How the decode side reaches the prefill replica (HTTP in the server)."""

    async def prefill(self, tokens: list[int], start: int) -> Descriptor:
        """Compute the prompt and offer the K/V of `tokens[start:]`."""

    async def release(self, desc: Descriptor) -> None:
        """The offer is no longer needed."""


@dataclass(slots=True)
class Reservation:
    transfer_id: str
    node: Any  # the locked radix node ending the cached prefix
    prefix_slots: torch.Tensor
    slots: torch.Tensor | None = None  # reserved for the fetched tokens


@dataclass(slots=True)
class PullResult:
    cached: int  # prompt tokens the decode replica had already
    fetched: int  # tokens whose K/V came from the prefill replica
    transport: str | None = None
    skipped: bool = False  # nothing worth fetching (short or already cached)


@dataclass(slots=True)
class _Counters:
    pulls: int = 0
    fetched_tokens: int = 0
    failures: int = 0
    skipped: int = 0
    last_error: str | None = field(default=None)


def _lock_prefix(engine: Any, tokens: list[int]) -> tuple[Any, torch.Tensor]:
    tree = radix_tree(engine)
    match = tree.match_prefix(tokens)
    tree.inc_lock_ref(match.last_node)
    return match.last_node, match.slots


class DecodeSide:
    def __init__(
        self, call: EngineCall, pool: Any, sinks: dict[str, KVSink], timeout_s: float = 30.0
    ) -> None:
        self.call = call
        self.pool = pool
        self.sinks = sinks
        self.timeout_s = timeout_s
        self.reservations: dict[str, Reservation] = {}
        self.counters = _Counters()
        self._tasks: set[asyncio.Task] = set()

    async def pull(
        self,
        tokens: list[int],
        peer: PrefillPeer | None = None,
        offer: Descriptor | None = None,
        min_new: int = 0,
    ) -> PullResult:
        """Bring the K/V of `tokens` into the tree: from `peer` (asked to prefill what this replica lacks) or
        from an `offer` already made. Fetches nothing when at most `min_new` tokens are missing."""
        if (peer is None) == (offer is None):
            raise KVTransferError("pull needs exactly one of a prefill peer or an offer")
        task = asyncio.create_task(self._pull(tokens, peer, offer, min_new))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _pull(
        self, tokens: list[int], peer: PrefillPeer | None, offer: Descriptor | None, min_new: int
    ) -> PullResult:
        node, prefix_slots = await self.call(lambda e: _lock_prefix(e, tokens))
        res = Reservation(uuid.uuid4().hex, node, prefix_slots)
        self.reservations[res.transfer_id] = res
        cached = prefix_slots.numel()
        desc: Descriptor | None = offer
        try:
            if len(tokens) - cached <= min_new:
                self.counters.skipped += 1
                return PullResult(cached, 0, skipped=True)
            if peer is not None:
                desc = await peer.prefill(tokens, cached)
            assert desc is not None
            check_layout(desc.layout, self.pool)
            sink = self.sinks.get(desc.transport)
            if sink is None:
                raise KVTransferError(f"this decode replica does not run the {desc.transport!r} transport")
            if desc.start > cached:
                raise KVTransferError(
                    f"the offer starts at token {desc.start}, but this replica holds only {cached} of the prompt"
                )
            end = min(desc.num_tokens, len(tokens))
            if end <= cached:
                self.counters.skipped += 1
                return PullResult(cached, 0, desc.transport, skipped=True)
            res.slots = await self.call(lambda e: e.cache.alloc_slots(end - cached))
            if res.slots is None:
                raise KVTransferError(
                    f"no room for {end - cached} tokens of K/V on this decode replica (its pool is held by running "
                    "requests); retry later or raise its KV memory"
                )
            view = SlotView(self.pool, res.slots)
            await asyncio.to_thread(self.sinks[desc.transport].fetch, desc, cached, view, self.timeout_s)
            await self.call(lambda e: self._commit(e, res, tokens[:end]))
            self.counters.pulls += 1
            self.counters.fetched_tokens += end - cached
            return PullResult(cached, end - cached, desc.transport)
        except Exception as exc:
            self.counters.failures += 1
            self.counters.last_error = str(exc)
            raise
        finally:
            if res.transfer_id in self.reservations:
                await self.call(lambda e: self._drop(e, res))
            if peer is not None and desc is not None:  # in the background: the request need not wait for it
                task = asyncio.create_task(self._release(peer, desc))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _release(peer: PrefillPeer, desc: Descriptor) -> None:
        try:
            await peer.release(desc)
        except Exception:  # noqa: BLE001 - the offer times out on its own
            logger.debug("release of offer %s failed", desc.transfer_id, exc_info=True)

    def _commit(self, engine: Any, res: Reservation, tokens: list[int]) -> None:
        """In the engine thread: the fetched tokens join the tree (duplicates of what got cached meanwhile are
        freed), the prefix lock is dropped."""
        tree = radix_tree(engine)
        assert res.slots is not None
        cached = res.prefix_slots.numel()
        result = tree.insert(tokens, torch.cat([res.prefix_slots, res.slots]))
        if result.cached_len > cached:
            engine.allocator.free(res.slots[: result.cached_len - cached])
        res.slots = None
        tree.dec_lock_ref(res.node)
        del self.reservations[res.transfer_id]

    def _drop(self, engine: Any, res: Reservation) -> None:
        """In the engine thread: the transfer failed; its slots go back to the free list, its lock is dropped."""
        if res.slots is not None:
            engine.allocator.free(res.slots)
            res.slots = None
        radix_tree(engine).dec_lock_ref(res.node)
        self.reservations.pop(res.transfer_id, None)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for sink in self.sinks.values():
            sink.close()

    def status(self) -> dict[str, Any]:
        c = self.counters
        return {
            "reservations": len(self.reservations),
            "reserved_tokens": sum(
                r.slots.numel() for r in self.reservations.values() if r.slots is not None
            ),
            "pulls": c.pulls,
            "fetched_tokens": c.fetched_tokens,
            "failures": c.failures,
            "skipped": c.skipped,
            "last_error": c.last_error,
            "transports": list(self.sinks),
        }
