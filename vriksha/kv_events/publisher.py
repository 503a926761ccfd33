"""Publishes a radix cache's changes: the engine's cache manager calls `stored` / `removed` / `cleared` (the
`CacheEventSink` protocol, in the engine's thread); a background thread seals what arrived into numbered batches every `interval_s` and sends them on
ZMQ PUB sockets (the token-granular stream, and optionally the vLLM block stream).

`snapshot(paths)` is taken in the engine's thread too: it seals the pending events first, so the snapshot is
the tree after exactly the batches numbered up to its `seq`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vriksha.kv_events.schema import (
    AllCleared,
    CacheSnapshot,
    EventBatch,
    PrefixMoved,
    PrefixRemoved,
    PrefixStored,
    encode_batch,
    seq_bytes,
)
from vriksha.kv_events.vllm_blocks import BlockView, VLLMEventBatch
from vriksha.net.curve import CurveKeys, stop_authenticator

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PublisherConfig:
    endpoint: str  # token-granular stream, e.g. tcp://127.0.0.1:5557
    vllm_endpoint: str | None = None  # vLLM block-hash stream
    vllm_block_size: int = 16
    interval_s: float = 0.005
    topic: bytes = b""
    # CURVE keys of the internal key: the token stream admits only subscribers holding it (the vLLM block
    # stream stays plain, for vllm-router, and is bound to loopback only: see server/cli.py)
    keys: CurveKeys | None = None


class KVEventPublisher:
    def __init__(self, config: PublisherConfig) -> None:
        import zmq

        self.config = config
        self.instance = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._pending: list[PrefixStored | PrefixRemoved | AllCleared | PrefixMoved] = [AllCleared()]
        self._outbox: list[tuple[int, EventBatch]] = []
        self._next_seq = 0
        self._vllm_seq = 0
        self._ctx = zmq.Context()
        self._pub = self._bind(zmq.PUB, config.endpoint, config.keys)
        self._vllm_pub = self._bind(zmq.PUB, config.vllm_endpoint) if config.vllm_endpoint else None
        self._blocks = BlockView(config.vllm_block_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vriksha-kv-events", daemon=True)
        self._thread.start()
        logger.info("KV events on %s (instance %s)", config.endpoint, self.instance)

    def _bind(self, kind: int, endpoint: str, keys: CurveKeys | None = None):
        import zmq

        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        if keys is not None:
            keys.serve(sock)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            sock.close()
            self._stop_auth()
            raise
        return sock

    def _stop_auth(self) -> None:
        if self.config.keys is not None:
            stop_authenticator(self._ctx)

    # ---- the engine's CacheEventSink (called in the engine's thread) ---------------------------------
    def stored(
        self, parent: Sequence[int], token_ids: Sequence[int], slots: Any = None, lora_name: str | None = None
    ) -> None:
        with self._lock:
            self._pending.append(PrefixStored([*parent, *token_ids], len(parent), lora_name))

    def removed(self, parent: Sequence[int], token_ids: Sequence[int], lora_name: str | None = None) -> None:
        with self._lock:
            self._pending.append(PrefixRemoved([*parent, *token_ids], len(token_ids), lora_name))

    def moved(
        self, parent: Sequence[int], token_ids: Sequence[int], medium: str, lora_name: str | None = None
    ) -> None:
        with self._lock:
            self._pending.append(PrefixMoved([*parent, *token_ids], len(token_ids), medium, lora_name))

    def cleared(self) -> None:
        with self._lock:
            self._pending.append(AllCleared())

    def snapshot(
        self,
        leaf_paths: Callable[[], list[list[int]]],
        adapter_paths: Callable[[], dict[str, list[list[int]]]] | None = None,
    ) -> CacheSnapshot:
        with self._lock:
            self._seal()
            adapters = adapter_paths() if adapter_paths is not None else {}
            return CacheSnapshot(
                instance=self.instance, seq=self._next_seq - 1, paths=leaf_paths(), adapters=adapters
            )

    @property
    def last_seq(self) -> int:
        """The number of the last batch sealed (sent or about to be)."""
        return self._next_seq - 1

    # ---- publishing ---------------------------------------------------------------------------------
    def _seal(self) -> None:
        if self._pending:
            batch = EventBatch(ts=time.time(), events=self._pending, instance=self.instance)
            self._outbox.append((self._next_seq, batch))
            self._next_seq += 1
            self._pending = []

    def flush(self) -> None:
        with self._lock:
            self._seal()
            out, self._outbox = self._outbox, []
        for seq, batch in out:
            self._pub.send_multipart([self.config.topic, seq_bytes(seq), encode_batch(batch)])
            if self._vllm_pub is not None:
                self._send_vllm(batch)

    def _send_vllm(self, batch: EventBatch) -> None:
        view, events = self._blocks, []
        for ev in batch.events:
            if isinstance(ev, PrefixStored):
                block = view.stored(ev.token_ids, ev.num_cached, ev.lora_name)
            elif isinstance(ev, PrefixRemoved):
                block = view.removed(ev.token_ids, ev.num_tokens, ev.lora_name)
            elif isinstance(ev, AllCleared):
                block = view.cleared()
            else:  # a tier move: the blocks stay cached
                continue
            if block is not None:
                events.append(block)
        if events:
            assert self._vllm_pub is not None
            payload = encode_batch(VLLMEventBatch(ts=batch.ts, events=events))  # type: ignore[arg-type]
            self._vllm_pub.send_multipart([self.config.topic, seq_bytes(self._vllm_seq), payload])
            self._vllm_seq += 1

    def _run(self) -> None:
        while not self._stop.wait(self.config.interval_s):
            try:
                self.flush()
            except Exception:  # a send failure must not stop the stream for good
                logger.exception("publishing KV events failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.flush()
        self._pub.close()
        if self._vllm_pub is not None:
            self._vllm_pub.close()
        self._stop_auth()
        self._ctx.term()
