"""The engine's side of weight updates: who may update, the data plane in use, the version, and the update
itself. Transport-free: the server's routes call it, and every method that touches parameters runs in the
engine's loop thread (between steps), so no request sees half an update.

Protocol (vLLM's names): init_weight_transfer_engine (answers a transfer token) -> start_weight_update ->
update_weights (one or more) -> finish_weight_update (the new version takes effect: prefix cache flushed,
outputs stamped with it). Every call after the first presents the token: one trainer's transfer is its own,
and another caller can neither push into nor finish nor close it.

An update is staged: each call's tensors are checked by name, dtype and shape before any byte moves, then
received into a staging copy; only a complete update, at finish, is copied into the parameters. A failed,
partial or abandoned update leaves the parameters and the version as they were; the version never moves
backwards unless the trainer says `rewind` (restoring older weights on purpose).

An update that starts with `adapter` (a LoRA adapter's name, rank, alpha and modules) carries that adapter's
tensors instead of the parameters, named by PEFT's keys, staged and checked the same way; a complete one goes to
the updater's adapter sink (`adapter_update.py`) under the new version.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vriksha.device import host
from vriksha.errors import VrikshaError
from vriksha.weights.adapter_serving import ServedAdapterSink
from vriksha.weights.adapter_update import (
    AdapterMeta,
    AdapterSink,
    MergedAdapterSink,
    adapter_targets,
    build_adapter,
)
from vriksha.weights.counters import CopyCounter
from vriksha.weights.fs import FILE, FsReceiver, file_specs
from vriksha.weights.plan import TensorSpec, WeightTransferError, check_sent, digest, layout, parse_specs
from vriksha.weights.protocol import WeightReceiver
from vriksha.weights.shm import ShmReceiver

logger = logging.getLogger(__name__)

BACKENDS = ("shm", "gloo", "fs")


class WeightClientConflict(VrikshaError):
    """Another trainer, or another transfer, holds this server's weight updates (or the request conflicts
    with the update in progress)."""


def engine_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.data for n, p in model.named_parameters()}


@dataclass(frozen=True, slots=True)
class Transfer:
    """One trainer's transfer: its calls present `token`, answered by its init."""

    client_id: str
    token: str


@dataclass(slots=True)
class Update:
    """The update in progress: its transfer, its version, and what arrived so far (staged, not applied)."""

    token: str
    version: int
    started_at: float
    staged: dict[str, torch.Tensor] = field(default_factory=dict)
    counter: CopyCounter = field(default_factory=CopyCounter)
    adapter: AdapterMeta | None = None  # an adapter-only update: the adapter it carries


@dataclass(slots=True)
class UpdateState:
    transfers: list[Transfer] = field(default_factory=list)
    backend: str | None = None
    receiver: WeightReceiver | None = None
    update: Update | None = None

    @property
    def owner(self) -> str | None:
        return self.transfers[-1].client_id if self.transfers else None

    @property
    def updating(self) -> bool:
        return self.update is not None


def _update_specs(backend: str, info: dict, params: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """What one update_weights call will write, checked against the engine's parameters before any copy."""
    if backend == "fs":
        d = info.get("dir")
        if not isinstance(d, str):
            raise WeightTransferError("update_info.dir must name the version's directory")
        return [spec for spec, _ in file_specs(Path(d) / FILE, params)[1]]
    specs = parse_specs(info.get("specs"))
    check_sent(specs, params)
    if backend == "shm":
        size = info.get("size")
        if not isinstance(size, int) or size < layout(specs)[1]:
            raise WeightTransferError(
                f"update_info.size {size!r} is smaller than the {layout(specs)[1]} bytes its specs take"
            )
    elif not isinstance(info.get("bucket_bytes"), int) or info["bucket_bytes"] <= 0:
        raise WeightTransferError("update_info.bucket_bytes must be a positive integer")
    return specs


class WeightUpdater:
    def __init__(self, allow_multiple_clients: bool = False, adapters: AdapterSink | None = None) -> None:
        self.allow_multiple_clients = allow_multiple_clients
        self.state = UpdateState()
        self.adapters: AdapterSink = adapters if adapters is not None else MergedAdapterSink()
        self._served = ServedAdapterSink()  # taken instead when the engine serves LoRA adapters by name

    # ---- who ----------------------------------------------------------------------------------------
    def claim(self, client_id: str) -> str:
        """A new transfer for `client_id`; answers its token. The same client claiming again (a restarted
        trainer) replaces its old transfer, rolling back an update that transfer left unfinished."""
        s = self.state
        others = [t for t in s.transfers if t.client_id != client_id]
        if others and not self.allow_multiple_clients:
            raise WeightClientConflict(
                f"weight updates on this server belong to client {others[0].client_id!r}; it must close its "
                "transfer (POST /close_communicator) first, or start the server with "
                "--allow-multiple-weight-clients"
            )
        if s.update is not None and s.update.token not in {
            t.token for t in s.transfers if t.client_id == client_id
        }:
            raise WeightClientConflict(
                "another client's weight update is in progress; retry when it finishes"
            )
        for old in [t for t in s.transfers if t.client_id == client_id]:
            self.release(old.token, close=False)  # the new transfer's init replaces the data plane
        token = secrets.token_urlsafe(24)
        s.transfers.append(Transfer(client_id, token))
        return token

    def transfer(self, client_id: str, token: str) -> Transfer:
        """The transfer `token` names, which must be `client_id`'s (else WeightClientConflict)."""
        if not self.state.transfers:
            raise WeightClientConflict(
                "no weight transfer is initialised; POST /init_weight_transfer_engine first"
            )
        for t in self.state.transfers:
            if hmac.compare_digest(t.token.encode(), token.encode()):
                if t.client_id != client_id:
                    raise WeightClientConflict(f"this transfer token belongs to client {t.client_id!r}")
                return t
        raise WeightClientConflict(
            "no weight transfer has this token (closed, or replaced by a newer init of the same client): "
            "POST /init_weight_transfer_engine again"
        )

    # ---- the data plane (engine loop thread) --------------------------------------------------------
    def init_backend(self, backend: str, info: dict) -> None:
        if backend not in BACKENDS:
            raise WeightTransferError(f"unknown weight transfer backend {backend!r}; use one of {BACKENDS}")
        self.close_backend()
        receiver: WeightReceiver
        if backend == "shm":
            receiver = ShmReceiver()
        elif backend == "fs":
            receiver = FsReceiver()
        else:
            from vriksha.weights.gloo import GlooReceiver

            receiver = GlooReceiver(info)
        self.state.backend, self.state.receiver = backend, receiver

    def close_backend(self) -> None:
        if self.state.receiver is not None:
            self.state.receiver.close()
        self.state.backend, self.state.receiver = None, None

    def release(self, token: str, close: bool = True) -> None:
        """End the transfer `token` (its unfinished update rolled back); the last one closes the data plane
        (`close`; in the engine thread)."""
        self.abort(token)
        self.state.transfers = [t for t in self.state.transfers if t.token != token]
        if close and not self.state.transfers:
            self.close_backend()

    # ---- one update ---------------------------------------------------------------------------------
    def start(
        self, token: str, version: int, served: int, rewind: bool = False, adapter: dict | None = None
    ) -> None:
        """Begin the update of `version`; `adapter`: it carries that adapter's tensors alone (`AdapterMeta`)."""
        meta = AdapterMeta.from_json(adapter) if adapter is not None else None
        s = self.state
        if s.receiver is None:
            raise WeightTransferError(
                "no weight transfer is initialised; POST /init_weight_transfer_engine first"
            )
        if s.update is not None and s.update.token != token:
            raise WeightClientConflict(
                "another transfer's weight update is in progress; retry when it finishes"
            )
        if version < served and not rewind:
            raise WeightClientConflict(
                f"version {version} is behind the served version {served}: versions only move forward (a trainer "
                "restoring older weights on purpose says rewind: true)"
            )
        s.update = Update(token, version, time.monotonic(), adapter=meta)

    def _current(self, token: str) -> Update:
        upd = self.state.update
        if upd is None or upd.token != token:
            raise WeightTransferError(
                "no weight update of this transfer is in progress; POST /start_weight_update first"
            )
        return upd

    def update(self, engine: Any, token: str, info: dict) -> dict:
        """Runs in the engine thread: check the sent tensors, then receive them into the update's staging copy
        (the parameters are untouched until `finish`)."""
        upd = self._current(token)
        params = self._targets(engine, upd)
        specs = _update_specs(str(self.state.backend), info, params)
        for spec in specs:
            if spec.name not in upd.staged:
                like = params[spec.name]  # an adapter's tensors are staged on the host
                upd.staged[spec.name] = (
                    torch.empty_like(like, device=host()) if like.is_meta else torch.empty_like(like)
                )
        target = {spec.name: upd.staged[spec.name] for spec in specs}
        receiver = self.state.receiver
        if receiver is None:
            raise WeightTransferError(
                "no weight transfer is initialised; POST /init_weight_transfer_engine first"
            )
        try:
            with torch.no_grad():
                got = receiver.receive(info, target, upd.counter)
        except WeightTransferError:
            raise
        except Exception as exc:  # the data plane failed mid-way (a dead peer, a vanished buffer)
            raise WeightTransferError(
                f"receiving the update failed ({type(exc).__name__}: {exc}); nothing was applied"
            ) from exc
        if self.state.update is not upd:
            raise WeightTransferError(
                "the update was rolled back (abandoned past its timeout) while it arrived"
            )
        if sorted(got) != sorted(target):
            raise WeightTransferError("the data plane delivered other tensors than the update named")
        return upd.counter.to_json()

    @staticmethod
    def _targets(engine: Any, upd: Update) -> dict[str, torch.Tensor]:
        """What the update writes: the engine's parameters, or the adapter's tensors (meta tensors)."""
        if upd.adapter is not None:
            return adapter_targets(engine.model, upd.adapter)
        return engine_parameters(engine.model)

    def finish(self, engine: Any, token: str) -> dict:
        """Runs in the engine thread: a complete update is copied into the parameters (an adapter update goes to
        the adapter sink) and takes effect (prefix cache flushed, derived layouts rebuilt, outputs stamped with
        its version)."""
        upd = self._current(token)
        params = self._targets(engine, upd)
        missing = sorted(set(params) - set(upd.staged))
        if missing:
            raise WeightTransferError(
                f"the update did not send {len(missing)} parameter(s), e.g. {missing[0]!r}; nothing was applied: "
                f"the engine keeps version {engine.weight_version}"
            )
        if upd.adapter is not None and getattr(engine, "loras", None) is not None:
            self.adapters = self._served  # a multi-LoRA engine: versions side by side, nothing waits
        side_by_side = upd.adapter is not None and getattr(self.adapters, "side_by_side", False)
        stats = engine.stats()
        if (stats.num_running or stats.num_waiting) and not side_by_side:
            raise WeightClientConflict(
                f"{stats.num_running + stats.num_waiting} requests are running; the update was not applied"
            )
        with torch.no_grad():
            if upd.adapter is not None:
                self.adapters.apply(engine, build_adapter(upd.adapter, upd.staged))
            else:
                for name, staged in upd.staged.items():
                    params[name].copy_(staged)
                    upd.counter.add(staged.nbytes)
                self.adapters.weights_replaced()
        if side_by_side:
            engine.weight_version = upd.version  # the base weights and their cached K/V are unchanged
        else:
            engine.set_weight_version(upd.version)
        self.state.update = None
        elapsed = time.monotonic() - upd.started_at
        logger.info(
            "weights now at version %d (%.3f s, %d B copied)", upd.version, elapsed, upd.counter.bytes_copied
        )
        return {"version": engine.weight_version, "seconds": elapsed, **upd.counter.to_json()}

    def abort(self, token: str | None = None) -> bool:
        """Roll back the update in progress (only `token`'s, when given): its staging copy is dropped."""
        upd = self.state.update
        if upd is None or (token is not None and upd.token != token):
            return False
        self.state.update = None
        return True


def parameter_digests(engine: Any, adapters: AdapterSink | None = None) -> dict[str, str]:
    """sha256 of every parameter, and of each tensor of the adapter in use (by PEFT key) when there is one."""
    out = {n: digest(t) for n, t in engine_parameters(engine.model).items()}
    if adapters is not None:
        out.update(adapters.digests())
    return out
