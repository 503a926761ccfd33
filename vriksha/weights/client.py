"""The trainer's side: push full weights to one `vriksha serve` under a version, over the data plane chosen
automatically (shared memory on the same node, else a gloo group, else the filesystem). It presents the
server's weights key (`weights_key`, else $VRIKSHA_WEIGHTS_KEY) and its transfer's token on every call."""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from vriksha.lora import AdapterError, LoraAdapter
from vriksha.net.trust import WEIGHTS_KEY_ENV, env_key, weights_headers
from vriksha.weights.adapter_update import AdapterMeta
from vriksha.weights.counters import CopyCounter
from vriksha.weights.node import NodeIdentity, node_identity
from vriksha.weights.plan import TensorSpec, WeightTransferError, check_specs
from vriksha.weights.protocol import WeightSender
from vriksha.weights.shm import shm_available
from vriksha.weights.source import full_parameters

logger = logging.getLogger(__name__)

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def same_host(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host in _LOOPBACK:
        return True
    try:
        local = {socket.gethostname(), socket.getfqdn(), *socket.gethostbyname_ex(socket.gethostname())[2]}
        return host in local or socket.gethostbyname(host) in local
    except OSError:
        return False


@dataclass(slots=True)
class PushResult:
    version: int
    backend: str
    seconds: float
    sender: dict
    receiver: dict


class WeightSyncClient:
    def __init__(
        self,
        base_url: str,
        client_id: str,
        backend: str = "auto",
        bucket_bytes: int = 64 * 2**20,
        fs_root: str | Path | None = None,
        timeout_s: float = 300.0,
        weights_key: str | None = None,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.client_id = client_id
        self.requested = backend
        self.bucket_bytes = bucket_bytes
        self.fs_root = Path(fs_root) if fs_root is not None else None
        key = weights_key or env_key(WEIGHTS_KEY_ENV)  # the server's --weights-key
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=weights_headers(key))
        self.token: str | None = None  # this transfer's, answered by the init
        self.backend: str | None = None
        self.sender: WeightSender | None = None
        self.specs: dict[str, TensorSpec] = {}

    # ---- http ---------------------------------------------------------------------------------------
    def _post(self, path: str, body: dict) -> dict:
        return self._answer(path, "post", json={"client_id": self.client_id, "token": self.token, **body})

    def _get(self, path: str) -> Any:
        return self._answer(path, "get")

    def _answer(self, path: str, method: str, **kwargs: Any) -> Any:
        import httpx

        try:
            r = self.http.request(method.upper(), path, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightTransferError(
                f"weight server {self.base_url} is unreachable ({path}): {exc}"
            ) from exc
        if r.status_code != 200:
            raise WeightTransferError(f"{self.base_url}{path} answered {r.status_code}: {r.text[:500]}")
        return r.json()

    def version(self) -> int:
        return int(self._get("/weight_version")["version"])

    def digests(self) -> dict[str, str]:
        return self._get("/weight_digests")

    # ---- setup --------------------------------------------------------------------------------------
    def shares_memory(self) -> bool:
        """Whether the server sees this process's /dev/shm: the same node identity (host name, boot id and
        /dev/shm mount, `node.py`); a server that states none is judged by its URL's host."""
        peer = NodeIdentity.from_json(self._get("/weight_version").get("node"))
        if peer is None:
            return same_host(self.base_url) and shm_available()
        return node_identity().shares_memory_with(peer) and shm_available()

    def _choose(self) -> list[str]:
        if self.requested != "auto":
            return [self.requested]
        order = ["shm"] if self.shares_memory() else []
        order.append("gloo")
        if self.fs_root is not None:
            order.append("fs")
        return order

    def connect(self) -> str:
        self.specs = {d["name"]: TensorSpec.from_json(d) for d in self._get("/weight_specs")}
        errors = []
        for backend in self._choose():
            try:
                self._init(backend)
                self.backend = backend
                logger.info("weights to %s over %s", self.base_url, backend)
                return backend
            except (WeightTransferError, RuntimeError, OSError) as exc:
                errors.append(f"{backend}: {exc}")
                logger.warning("weight transfer over %s to %s failed: %s", backend, self.base_url, exc)
        raise WeightTransferError(
            f"no weight transfer to {self.base_url} could be set up: " + "; ".join(errors)
        )

    def _init(self, backend: str) -> None:
        if backend == "shm":
            from vriksha.weights.shm import ShmSender

            self.sender = ShmSender()
            self._init_transfer({"backend": "shm", "init_info": {}})
        elif backend == "fs":
            from vriksha.weights.fs import FsSender

            if self.fs_root is None:
                raise WeightTransferError("the filesystem backend needs a directory both sides can read")
            self.sender = FsSender(self.fs_root)
            self._init_transfer({"backend": "fs", "init_info": self.sender.init_info()})
        elif backend == "gloo":
            from vriksha.weights.gloo import GlooSender

            host = "127.0.0.1" if same_host(self.base_url) else socket.gethostbyname(socket.gethostname())
            sender = GlooSender(host, self.bucket_bytes)
            body = {"backend": "gloo", "init_info": sender.init_info()}
            try:
                self._concurrently(lambda: self._init_transfer(body), sender.connect)
            except BaseException:
                sender.close()
                raise
            self.sender = sender
        else:
            raise WeightTransferError(
                f"unknown weight transfer backend {backend!r}; use auto, shm, gloo or fs"
            )

    def _init_transfer(self, body: dict) -> dict:
        """Open the transfer; every later call of it presents the token the server answers."""
        reply = self._post("/init_weight_transfer_engine", body)
        self.token = str(reply["token"])
        return reply

    def _concurrently(self, request: Any, local: Any) -> Any:
        """Run an HTTP request in a thread while `local(failed)` (the sender's half of a collective) runs here;
        `failed()` returns the request's error once it has one."""
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["result"] = request()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                out["error"] = exc

        t = threading.Thread(target=run, name="vriksha-weights-http", daemon=True)
        t.start()
        try:
            local(lambda: out.get("error"))
        finally:
            t.join()
        if "error" in out:
            raise out["error"]
        return out["result"]

    # ---- one update ---------------------------------------------------------------------------------
    @torch.no_grad()
    def push(self, module: torch.nn.Module, version: int, rewind: bool = False) -> PushResult:
        """Send every parameter of `module` (full tensors, cast once to the server's dtypes) as `version`;
        `rewind`: the server may be at a later version (restoring older weights on purpose)."""
        if self.sender is None:
            self.connect()
        t0 = time.perf_counter()
        dtypes = {n: s.torch_dtype for n, s in self.specs.items()}
        tensors = list(full_parameters(module, dtypes))
        check_specs([TensorSpec.of(n, t) for n, t in tensors], {n: _meta(s) for n, s in self.specs.items()})
        return self._send(tensors, {"version": version, "rewind": rewind}, t0)

    @torch.no_grad()
    def push_adapter(self, adapter: LoraAdapter, version: int, rewind: bool = False) -> PushResult:
        """Send a LoRA adapter's tensors alone (float32, under PEFT's keys) as `version`: the server serves
        its base model with this adapter from then on (the server checks them against its linear layers)."""
        if self.sender is None:
            self.connect()
        t0 = time.perf_counter()
        # checked against the served model's weights before anything moves: a collective plane (gloo) would
        # otherwise wait out its timeout for a receiver that refused the update
        shapes = {
            n.removesuffix(".weight"): (s.shape[0], s.shape[1])
            for n, s in self.specs.items()
            if n.endswith(".weight") and len(s.shape) == 2
        }
        try:
            adapter.check_base(shapes)
        except AdapterError as exc:
            raise WeightTransferError(f"{self.base_url} cannot take this adapter: {exc}") from None
        tensors = [(k, t.detach().float().contiguous()) for k, t in adapter.peft_state_dict().items()]
        start = {"version": version, "rewind": rewind, "adapter": AdapterMeta.of(adapter).to_json()}
        return self._send(tensors, start, t0)

    def _send(self, tensors: list[tuple[str, torch.Tensor]], start: dict, t0: float) -> PushResult:
        """One update: start it (`start` is the body), move `tensors` over the data plane, finish it."""
        version = int(start["version"])
        counter = CopyCounter()
        sender = self.sender
        if sender is None:
            raise WeightTransferError(f"no weight transfer to {self.base_url} is set up; connect() first")
        self._post("/start_weight_update", start)
        try:
            body = {"update_info": sender.prepare(tensors, counter, version)}
            reply = self._concurrently(
                lambda: self._post("/update_weights", body),
                lambda _failed: sender.transmit(tensors, counter),
            )
            done = self._post("/finish_weight_update", {})
        except BaseException:
            logger.warning("weight update %d to %s failed", version, self.base_url)
            raise
        if int(done["version"]) != version:
            raise WeightTransferError(
                f"{self.base_url} reports version {done['version']} after pushing {version}"
            )
        return PushResult(
            version, str(self.backend), time.perf_counter() - t0, counter.to_json(), reply["receiver"]
        )

    def reset(self) -> None:
        """Forget the data plane (a restarted server holds none); the next push sets one up again."""
        if self.sender is not None:
            self.sender.close()
        self.sender = self.backend = None

    def close(self) -> None:
        try:
            if self.backend is not None:
                self._post("/close_communicator", {})
        except WeightTransferError as exc:
            logger.debug("close: %s", exc)
        if self.sender is not None:
            self.sender.close()
        self.sender = self.backend = self.token = None
        self.http.close()


def _meta(spec: TensorSpec) -> torch.Tensor:
    return torch.empty(spec.shape, dtype=spec.torch_dtype, device="meta")
