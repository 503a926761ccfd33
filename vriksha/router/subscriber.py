"""Follows one replica's KV event stream into a `TokenTree`: batches in sequence order; a gap, a new replica
instance, or a stream that falls behind the sequence number the replica reports triggers a resync from the
replica's snapshot (`GET /kv_events/snapshot`). Both take the replicas' internal key: the snapshot as a
header, the stream as the CURVE keys derived from it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import msgspec

from vriksha.kv_events.schema import (
    AllCleared,
    CacheSnapshot,
    EventBatch,
    PrefixRemoved,
    PrefixStored,
    decode_batch,
    keyed,
    seq_from_bytes,
)
from vriksha.kv_events.token_tree import TokenTree
from vriksha.net.curve import CurveKeys
from vriksha.net.trust import internal_headers

logger = logging.getLogger(__name__)


class EventSubscriber:
    def __init__(
        self,
        name: str,
        endpoint: str,
        snapshot_url: str,
        http: httpx.AsyncClient,
        on_resync: Callable[[str], None] = lambda reason: None,
        internal_key: str | None = None,
    ) -> None:
        self.name = name
        self.headers = internal_headers(internal_key)
        self.keys = CurveKeys.from_key(internal_key) if internal_key else None
        self.endpoint = endpoint
        self.snapshot_url = snapshot_url
        self.http = http
        self.on_resync = on_resync
        self.tree = TokenTree()
        self.adapters: set[str] = set()  # LoRA adapters whose paths this mirror has seen
        self.instance: str | None = None
        self.seq = -1  # last batch applied
        self.synced = False
        self.batches = 0
        self._resync_wanted: str | None = "start"
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-events-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def request_resync(self, reason: str) -> None:
        self._resync_wanted = self._resync_wanted or reason

    def check_behind(self, instance: str | None, seq: int) -> None:
        """The replica says its last batch is `seq` of `instance`: if we are elsewhere, resync."""
        if instance is not None and instance != self.instance:
            self.request_resync("restart")
        elif seq > self.seq and self.synced:
            self._behind = getattr(self, "_behind", 0) + 1
            if self._behind >= 3:  # a few polls: batches in flight are not lost
                self.request_resync("behind")
                self._behind = 0
        else:
            self._behind = 0

    # ---- applying ------------------------------------------------------------------------------------
    def apply(self, batch: EventBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, PrefixStored):
                self.tree.insert(keyed(ev.token_ids, ev.lora_name))
                if ev.lora_name is not None:
                    self.adapters.add(ev.lora_name)
            elif isinstance(ev, PrefixRemoved):
                self.tree.remove(keyed(ev.token_ids, ev.lora_name), ev.num_tokens)
            elif isinstance(ev, AllCleared):
                self.tree.clear()
            # PrefixMoved: the replica's second KV tier took or gave back the K/V; the path stays cached

    def on_message(self, seq: int, batch: EventBatch) -> None:
        """One batch off the wire; asks for a resync instead of applying it out of order."""
        if not self.synced:
            return
        if batch.instance != self.instance:
            self.request_resync("restart")
            self.synced = False
            return
        if seq <= self.seq:
            return  # already in the snapshot
        if seq != self.seq + 1:
            logger.warning("%s: KV events %d..%d lost; resyncing", self.name, self.seq + 1, seq - 1)
            self.request_resync("gap")
            self.synced = False
            return
        self.apply(batch)
        self.seq = seq
        self.batches += 1

    async def resync(self, reason: str) -> None:
        resp = await self.http.get(self.snapshot_url, headers=self.headers, timeout=10)
        resp.raise_for_status()
        snap = msgspec.json.decode(resp.content, type=CacheSnapshot)
        adapters = [keyed(p, name) for name, paths in snap.adapters.items() for p in paths]
        self.tree = TokenTree.from_paths([*snap.paths, *adapters])
        self.adapters = set(snap.adapters)
        self.instance, self.seq, self.synced = snap.instance, snap.seq, True
        self.on_resync(reason)
        logger.info("%s: resynced (%s) at seq %d, %d tokens", self.name, reason, snap.seq, self.tree.size)

    async def _run(self) -> None:
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        if self.keys is not None:
            self.keys.connect(sock)
        sock.connect(self.endpoint)
        try:
            while True:
                if self._resync_wanted is not None:
                    reason, self._resync_wanted = self._resync_wanted, None
                    try:
                        await self.resync(reason)
                    except (httpx.HTTPError, msgspec.DecodeError) as exc:
                        logger.info("%s: snapshot failed (%s); retrying", self.name, exc)
                        self._resync_wanted = reason
                        await asyncio.sleep(0.5)
                        continue
                if not await sock.poll(100):
                    continue
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    continue
                try:
                    self.on_message(seq_from_bytes(frames[1]), decode_batch(frames[2]))
                except Exception:  # an undecodable batch or a bug: never leave the mirror silently stale
                    logger.exception("%s: could not apply a KV event batch; resyncing", self.name)
                    self.synced = False
                    self.request_resync("error")
        finally:
            sock.close()
