"""K/V transfer over a ZMQ stream, for replicas on different hosts (or wherever shared memory is not wanted).

The source binds one ROUTER socket (`--kv-transfer-endpoint`) served by a thread of its own; an offer keeps
the tokens' slots locked in the source's radix tree and is read from the pool when the sink asks. The sink
sends `{"id", "begin", "end"}` and receives one multipart message: a JSON header, then per layer the K and
V bytes of those tokens (raw, in the pool's dtype), which it copies into its slots. A ZMQ multipart message
arrives whole or not at all, so a source that dies mid-send leaves the sink with nothing and a timeout.
Both sockets take a `secure` hook: the server keys them with CURVE, so only holders of its internal key
connect, and the bytes are encrypted on the wire.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import zmq

from vriksha.engine.kv_transfer.transport import (
    Descriptor,
    KVSink,
    KVSource,
    KVTransferError,
    SlotView,
    register,
)

logger = logging.getLogger(__name__)

Secure = Callable[
    [zmq.Socket], None
]  # configures a socket before bind/connect (CURVE keys: vriksha.net.curve)


def _advertised(endpoint: str) -> str:
    """The endpoint as a sink elsewhere dials it: a wildcard host becomes this host's name."""
    head, _, port = endpoint.rpartition(":")
    host = head.removeprefix("tcp://")
    if host in ("*", "0.0.0.0", "::", "[::]"):
        return f"tcp://{socket.gethostname()}:{port}"
    return endpoint


class StreamSource(KVSource):
    name = "stream"
    holds_slots = True

    def __init__(self, endpoint: str = "tcp://127.0.0.1:*", secure: Secure | None = None, **_: Any) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if secure is not None:
            secure(self._sock)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self._sock.close()
            raise KVTransferError(
                f"cannot bind the K/V stream socket {endpoint}: {exc}; pick a free --kv-transfer-endpoint"
            ) from exc
        self.endpoint = _advertised(self._sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self._offers: dict[str, SlotView] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="vriksha-kv-stream", daemon=True)
        self._thread.start()

    def offer(self, transfer_id: str, kv: SlotView) -> dict[str, Any]:
        with self._lock:
            self._offers[transfer_id] = kv
        return {"endpoint": self.endpoint}

    def withdraw(self, transfer_id: str) -> None:
        with self._lock:
            self._offers.pop(transfer_id, None)

    @property
    def num_offers(self) -> int:
        return len(self._offers)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            self._offers.clear()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(100):
                    continue
                ident, *parts = self._sock.recv_multipart()
                try:
                    frames = self._answer(parts[-1])
                except Exception as exc:  # noqa: BLE001 - told to the sink, the source goes on
                    frames = [json.dumps({"error": str(exc)}).encode()]
                self._sock.send_multipart([ident, b"", *frames], copy=False)
        finally:
            self._sock.close()

    def _answer(self, raw: bytes) -> list[Any]:
        ask = json.loads(raw)
        with self._lock:
            kv = self._offers.get(str(ask["id"]))
        if kv is None:
            raise KVTransferError(f"no transfer {ask['id']} here (withdrawn after its hold timeout?)")
        begin, end = int(ask["begin"]), int(ask["end"])
        if not 0 <= begin < end <= kv.num_tokens:
            raise KVTransferError(f"tokens {begin}..{end} asked of an offer of {kv.num_tokens}")
        part = SlotView(kv.pool, kv.slots[begin:end])
        frames: list[Any] = [json.dumps({"ok": True, "layers": kv.pool.num_layers}).encode()]
        for layer in range(kv.pool.num_layers):
            k, v = part.read(layer)
            frames += [k.view(torch.uint8).numpy(), v.view(torch.uint8).numpy()]
        return frames


class StreamSink(KVSink):
    name = "stream"

    def __init__(self, secure: Secure | None = None, **_: Any) -> None:
        self._ctx = zmq.Context.instance()
        self._secure = secure

    def fetch(self, desc: Descriptor, begin: int, into: SlotView, timeout_s: float) -> None:
        endpoint = str(desc.info.get("endpoint", ""))
        a = begin - desc.start
        ask = {"id": desc.transfer_id, "begin": a, "end": a + into.num_tokens}
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self._secure is not None:
            self._secure(sock)
        try:
            sock.connect(endpoint)
            sock.send_multipart([b"", json.dumps(ask).encode()])
            if not sock.poll(int(timeout_s * 1000)):
                raise KVTransferError(
                    f"no K/V from the prefill replica at {endpoint} within {timeout_s:.1f} s (transfer "
                    f"{desc.transfer_id}): it died or is stuck"
                )
            _, header, *frames = sock.recv_multipart(copy=False)
        finally:
            sock.close()
        head = json.loads(header.bytes)
        if not head.get("ok"):
            raise KVTransferError(
                f"the prefill replica refused transfer {desc.transfer_id}: {head.get('error')}"
            )
        pool = into.pool
        if len(frames) != 2 * pool.num_layers:
            raise KVTransferError(
                f"transfer {desc.transfer_id}: {len(frames)} frames for {pool.num_layers} layers"
            )
        n = into.num_tokens
        with warnings.catch_warnings():  # the frames are read-only buffers, and only read
            warnings.simplefilter("ignore", UserWarning)
            for layer, shape in enumerate(pool.layout.layers):
                k = torch.frombuffer(frames[2 * layer].buffer, dtype=torch.uint8).view(pool.dtype)
                v = torch.frombuffer(frames[2 * layer + 1].buffer, dtype=torch.uint8).view(pool.dtype)
                into.write(
                    layer, k.view(n, shape.kv_heads, shape.k_dim), v.view(n, shape.kv_heads, shape.v_dim)
                )


register("stream", StreamSource, StreamSink)
