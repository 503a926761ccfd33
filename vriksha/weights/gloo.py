"""Across hosts: a dedicated two-member gloo process group (trainer rank 0, engine rank 1) built on its own
TCP store, apart from any default group the trainer uses. Tensors travel in packed buckets of
`bucket_bytes`; two buffers per side, so the sender packs bucket i+1 while bucket i is on the wire and the
receiver copies bucket i into its parameters while bucket i+1 arrives.

Copies per update: the sender packs each tensor into a bucket once; the receiver copies each tensor from
its bucket into the parameter once (one model-sized copy per side).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from vriksha.weights.counters import CopyCounter
from vriksha.weights.plan import Bucket, TensorSpec, WeightTransferError, buckets, view
from vriksha.weights.protocol import NamedTensors

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 64 * 2**20
JOINED = "vriksha-weights-joined"


def make_group(
    host: str, port: int, rank: int, store: dist.Store | None, timeout_s: float
) -> dist.ProcessGroup:
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size=2, is_master=False, timeout=timeout)
        store.set(JOINED, "1")
    group = dist.ProcessGroupGloo(dist.PrefixStore("vriksha-weights", store), rank, 2, timeout)
    # a gloo Backend, used as a group: it has broadcast(tensor, root), which torch's stubs declare on
    # ProcessGroup alone
    return group  # type: ignore[return-value]


def _buffers(plan: list[Bucket]) -> list[torch.Tensor]:
    size = max((b.nbytes for b in plan), default=0)
    return [torch.empty(size, dtype=torch.uint8) for _ in range(2 if len(plan) > 1 else 1)]


class GlooSender:
    name = "gloo"

    def __init__(
        self, host: str = "127.0.0.1", bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 120.0
    ):
        self.host = host
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.store = dist.TCPStore(
            host,
            0,
            world_size=2,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self.group: dist.ProcessGroup | None = None
        self._bufs: list[torch.Tensor] = []

    def init_info(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.store.port, "timeout_s": self.timeout_s}

    def connect(self, failed: Callable[[], BaseException | None] = lambda: None) -> None:
        """Join the group once the engine has reached the store (call while its init request is in flight;
        `failed()` returns that request's error, which ends the wait at once)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check([JOINED]):
            err = failed()
            if err is not None:
                raise err
            if time.monotonic() > deadline:
                raise WeightTransferError(
                    f"the engine did not join the gloo group within {self.timeout_s:.0f} s"
                )
            time.sleep(0.01)
        self.group = make_group(self.host, self.store.port, 0, self.store, self.timeout_s)

    def prepare(self, tensors: NamedTensors, counter: CopyCounter, version: int = 0) -> dict[str, Any]:
        specs = [TensorSpec.of(n, t) for n, t in tensors]
        return {"bucket_bytes": self.bucket_bytes, "specs": [s.to_json() for s in specs]}

    def transmit(self, tensors: NamedTensors, counter: CopyCounter) -> None:
        if self.group is None:
            raise WeightTransferError("the gloo group is not connected; init the weight transfer first")
        specs = [TensorSpec.of(n, t) for n, t in tensors]
        plan = buckets(specs, self.bucket_bytes)
        if not self._bufs or self._bufs[0].numel() < max(b.nbytes for b in plan):
            self._bufs = _buffers(plan)
        by_name = dict(tensors)
        works: list = [None] * len(self._bufs)
        for i, b in enumerate(plan):
            slot = i % len(self._bufs)
            if works[slot] is not None:
                works[slot].wait()  # this buffer's previous bucket has left
            buf = self._bufs[slot]
            for s, off in zip(b.specs, b.offsets, strict=True):
                view(buf, off, s).copy_(by_name[s.name])
                counter.add(s.nbytes)
            works[slot] = self.group.broadcast(buf[: b.nbytes], 0)
            counter.bytes_moved += b.nbytes
        for w in works:
            if w is not None:
                w.wait()

    def close(self) -> None:
        self.group = None
        self._bufs = []


class GlooReceiver:
    name = "gloo"

    def __init__(self, info: dict[str, Any]) -> None:
        self.group = make_group(
            str(info["host"]), int(info["port"]), 1, None, float(info.get("timeout_s", 120))
        )
        self._bufs: list[torch.Tensor] = []

    def receive(
        self, info: dict[str, Any], target: dict[str, torch.Tensor], counter: CopyCounter
    ) -> list[str]:
        specs = [TensorSpec.from_json(d) for d in info["specs"]]
        plan = buckets(specs, int(info["bucket_bytes"]))
        if not plan:
            return []
        if not self._bufs or self._bufs[0].numel() < max(b.nbytes for b in plan):
            self._bufs = _buffers(plan)
        n = len(self._bufs)
        works = [self.group.broadcast(self._bufs[0][: plan[0].nbytes], 0)]
        for i, b in enumerate(plan):
            works[i].wait()
            if i + 1 < len(plan):  # the next bucket arrives into the other buffer while this one is copied
                nxt = plan[i + 1]
                works.append(self.group.broadcast(self._bufs[(i + 1) % n][: nxt.nbytes], 0))
            buf = self._bufs[i % n]
            for s, off in zip(b.specs, b.offsets, strict=True):
                target[s.name].copy_(view(buf, off, s))
                counter.add(s.nbytes)
            counter.bytes_moved += b.nbytes
        return [s.name for s in specs]

    def close(self) -> None:
        self._bufs = []
