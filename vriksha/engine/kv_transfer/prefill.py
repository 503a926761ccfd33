"""The prefill replica's side of a transfer: offer a computed prompt's K/V, hold it until the decode replica
is done with it, and let it go then, or when the hold times out: nothing stays locked or mapped for a
decode replica that never comes.

Engine state (the radix tree's locks) is touched only through `call`, which runs a function in the engine's
thread between steps (`AsyncEngine.call`); the copying runs off it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import torch

from vriksha.engine.kv_transfer.transport import (
    Descriptor,
    KVSource,
    KVTransferError,
    SlotView,
    choose_transport,
    describe_layout,
    host_id,
)

logger = logging.getLogger(__name__)

EngineCall = Callable[[Callable[[Any], Any]], Awaitable[Any]]


@dataclass(slots=True)
class Offer:
    transfer_id: str
    source: KVSource
    node: Any  # the radix node locked for the offer (None once unlocked)
    num_tokens: int  # tokens offered
    deadline: float


def radix_tree(engine: Any) -> Any:
    tree = getattr(engine.cache, "tree", None)
    if tree is None:
        raise KVTransferError(
            "prefill/decode roles need the prefix cache (the K/V moves through the radix tree); drop "
            "--no-enable-prefix-caching"
        )
    return tree


def _lock_prefix(engine: Any, tokens: list[int]) -> tuple[Any, torch.Tensor]:
    tree = radix_tree(engine)
    match = tree.match_prefix(tokens)
    tree.inc_lock_ref(match.last_node)
    return match.last_node, match.slots


def _unlock(engine: Any, node: Any) -> None:
    radix_tree(engine).dec_lock_ref(node)


class PrefillSide:
    def __init__(
        self, call: EngineCall, pool: Any, sources: dict[str, KVSource], hold_s: float = 30.0
    ) -> None:
        self.call = call
        self.pool = pool
        self.sources = sources
        self.hold_s = hold_s
        self.offers: dict[str, Offer] = {}
        self.offered = 0
        self.released = 0
        self.expired = 0

    async def offer(
        self, tokens: list[int], start: int, wanted: list[str], sink_host: str, hold_s: float | None = None
    ) -> Descriptor:
        """Offer the cached K/V of `tokens[start:]` (the caller has just computed the prompt). The offer holds
        until `release` or `hold_s` (default: the side's)."""
        transport = choose_transport(wanted, list(self.sources), sink_host)
        source = self.sources[transport]
        node, slots = await self.call(lambda e: _lock_prefix(e, tokens))
        n = slots.numel()
        if n <= start:
            await self.call(lambda e: _unlock(e, node))
            raise KVTransferError(
                f"the prefill replica holds {n} tokens of the prompt, none past {start} (evicted at once: raise "
                "its KV memory)"
            )
        transfer_id = uuid.uuid4().hex
        try:
            info = await asyncio.to_thread(source.offer, transfer_id, SlotView(self.pool, slots[start:]))
        except BaseException:
            await self.call(lambda e: _unlock(e, node))
            raise
        if not source.holds_slots:
            await self.call(lambda e: _unlock(e, node))
            node = None
        hold = self.hold_s if hold_s is None else min(hold_s, self.hold_s)
        self.offers[transfer_id] = Offer(transfer_id, source, node, n - start, time.monotonic() + hold)
        self.offered += 1
        return Descriptor(
            transfer_id=transfer_id,
            transport=transport,
            num_tokens=n,
            start=start,
            layout=describe_layout(self.pool.layout, self.pool.dtype),
            host_id=host_id(),
            info=info,
        )

    async def release(self, transfer_id: str, expired: bool = False) -> bool:
        """The decode replica is done with the offer (or it timed out): free what it holds."""
        offer = self.offers.pop(transfer_id, None)
        if offer is None:
            return False
        try:
            await asyncio.to_thread(offer.source.withdraw, transfer_id)
        finally:
            if offer.node is not None:
                node = offer.node
                await self.call(lambda e: _unlock(e, node))
        if expired:
            self.expired += 1
            logger.warning("K/V offer %s expired unfetched; its memory is freed", transfer_id)
        else:
            self.released += 1
        return True

    async def sweep(self) -> int:
        """Release every offer past its hold; returns how many."""
        now = time.monotonic()
        late = [t for t, o in self.offers.items() if o.deadline <= now]
        for transfer_id in late:
            await self.release(transfer_id, expired=True)
        return len(late)

    async def close(self) -> None:
        for transfer_id in list(self.offers):
            try:
                await self.release(transfer_id)
            except Exception:  # noqa: BLE001 - the engine is going away with its tree
                logger.debug("release of %s at close failed", transfer_id, exc_info=True)
        for source in self.sources.values():
            source.close()

    def status(self) -> dict[str, Any]:
        return {
            "offers": len(self.offers),
            "held_tokens": sum(o.num_tokens for o in self.offers.values()),
            "offered": self.offered,
            "released": self.released,
            "expired": self.expired,
            "transports": list(self.sources),
        }
