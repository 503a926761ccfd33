"""Micro-batching: concurrent requests' texts embedded together. The first text of a batch waits up to
`max_wait_ms` for company (or until `max_batch`); texts arriving while a batch runs form the next one.
A text seen recently (exactly the same string) is answered from a small LRU of embeddings, unbatched."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

logger = logging.getLogger(__name__)


class EmbedBatcher:
    def __init__(
        self,
        encode: Callable[[list[str]], torch.Tensor],
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
        on_batch: Callable[[int, float], None] | None = None,
        memo_entries: int = 0,
    ) -> None:
        self.encode = encode
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.on_batch = on_batch
        self.memo = EmbeddingMemo(memo_entries)
        self._queue: asyncio.Queue[tuple[str, asyncio.Future]] | None = None
        self._worker: asyncio.Task | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="embed")

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run(), name="embed-batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def embed(self, text: str) -> torch.Tensor:
        found = self.memo.get(text)
        if found is not None:
            return found
        if self._queue is None:
            self.start()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        assert self._queue is not None
        self._queue.put_nowait((text, fut))
        emb = await fut
        self.memo.put(text, emb)
        return emb

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
            live = [(t, f) for t, f in batch if not f.done()]
            if not live:
                continue
            started = time.perf_counter()
            try:
                emb = await loop.run_in_executor(self._pool, self.encode, [t for t, _ in live])
            except Exception as exc:  # noqa: BLE001 - each waiting request gets the error, the loop lives on
                logger.exception("embedding a batch of %d failed", len(live))
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            if self.on_batch is not None:
                self.on_batch(len(live), time.perf_counter() - started)
            for i, (_, f) in enumerate(live):
                if not f.done():
                    f.set_result(emb[i])


class EmbeddingMemo:
    """The embeddings of the last `entries` distinct texts (exact string match, keyed by a 16-byte digest so a
    long prompt costs no more than a short one), least recently used out."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._items: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, text: str) -> torch.Tensor | None:
        if self.entries <= 0:
            return None
        key = _digest(text)
        emb = self._items.get(key)
        if emb is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return emb

    def put(self, text: str, emb: torch.Tensor) -> None:
        if self.entries <= 0:
            return
        key = _digest(text)
        self._items[key] = emb
        self._items.move_to_end(key)
        while len(self._items) > self.entries:
            self._items.popitem(last=False)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
