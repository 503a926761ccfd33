"""The engine's side of weight updates: who may update, the data plane in use, the version, and the copy
into the engine's parameters in place. Transport-free: the server's routes call it, and every method that
touches parameters runs in the engine's loop thread (between steps), so no request sees half an update.

Protocol (vLLM's names): init_weight_transfer_engine -> start_weight_update -> update_weights (one or more)
-> finish_weight_update (the new version takes effect: prefix cache flushed, outputs stamped with it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vriksha.errors import VrikshaError
from vriksha.weights.counters import CopyCounter
from vriksha.weights.fs import FsReceiver
from vriksha.weights.plan import TensorSpec, WeightTransferError, check_specs, digest
from vriksha.weights.protocol import WeightReceiver
from vriksha.weights.shm import ShmReceiver

logger = logging.getLogger(__name__)

BACKENDS = ("shm", "gloo", "fs")


class WeightClientConflict(VrikshaError):
    """Another trainer holds this server's weight updates."""


def engine_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.data for n, p in model.named_parameters()}


@dataclass(slots=True)
class UpdateState:
    owner: str | None = None
    backend: str | None = None
    receiver: WeightReceiver | None = None
    updating: bool = False
    pending_version: int | None = None
    counter: CopyCounter = field(default_factory=CopyCounter)
    started_at: float = 0.0
    received: set[str] = field(default_factory=set)


class WeightUpdater:
    def __init__(self, allow_multiple_clients: bool = False) -> None:
        self.allow_multiple_clients = allow_multiple_clients
        self.state = UpdateState()

    # ---- who ----------------------------------------------------------------------------------------
    def claim(self, client_id: str) -> None:
        owner = self.state.owner
        if owner is not None and owner != client_id and not self.allow_multiple_clients:
            raise WeightClientConflict(
                f"weight updates on this server belong to client {owner!r}; it must close its transfer "
                "(POST /close_communicator) first, or start the server with --allow-multiple-weight-clients"
            )
        self.state.owner = client_id

    def check_owner(self, client_id: str) -> None:
        if self.state.owner is None:
            raise WeightTransferError(
                "no weight transfer is initialised; POST /init_weight_transfer_engine first"
            )
        if self.state.owner != client_id and not self.allow_multiple_clients:
            raise WeightClientConflict(f"weight updates on this server belong to client {self.state.owner!r}")

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
        self.state.backend = self.state.receiver = None

    def release(self) -> None:
        self.close_backend()
        self.state.owner = None
        self.state.updating = False

    # ---- one update ---------------------------------------------------------------------------------
    def start(self, version: int) -> None:
        s = self.state
        if s.receiver is None:
            raise WeightTransferError(
                "no weight transfer is initialised; POST /init_weight_transfer_engine first"
            )
        s.updating, s.pending_version, s.counter, s.started_at = (
            True,
            version,
            CopyCounter(),
            time.monotonic(),
        )
        s.received = set()

    def update(self, engine: Any, info: dict) -> dict:
        """Runs in the engine thread: copy the update's tensors into the engine's parameters in place."""
        s = self.state
        if not s.updating:
            raise WeightTransferError("no weight update is in progress; POST /start_weight_update first")
        target = engine_parameters(engine.model)
        specs = [TensorSpec.from_json(d) for d in info.get("specs", [])] if "specs" in info else None
        if specs is not None:
            check_specs(specs, {n: target[n] for n in target if n in {sp.name for sp in specs}})
        receiver = s.receiver
        if receiver is None:
            raise WeightTransferError(
                "no weight transfer is initialised; POST /init_weight_transfer_engine first"
            )
        engine.weight_version = -1  # in flux until finish: a failed update is never mistaken for a version
        with torch.no_grad():
            s.received.update(receiver.receive(info, target, s.counter))
        return s.counter.to_json()

    def finish(self, engine: Any) -> dict:
        """Runs in the engine thread: the new version takes effect (prefix cache flushed, derived layouts
        rebuilt, outputs stamped with it)."""
        s = self.state
        if not s.updating:
            raise WeightTransferError("no weight update is in progress; POST /start_weight_update first")
        missing = sorted(set(engine_parameters(engine.model)) - s.received)
        if missing:
            raise WeightTransferError(
                f"the update did not send {len(missing)} parameter(s), e.g. {missing[0]!r}; the engine keeps "
                f"version {engine.weight_version} until a full update finishes"
            )
        if s.pending_version is None:
            raise WeightTransferError("no weight update is in progress; POST /start_weight_update first")
        engine.set_weight_version(s.pending_version)
        s.updating = False
        elapsed = time.monotonic() - s.started_at
        logger.info(
            "weights now at version %d (%.3f s, %d B copied)",
            engine.weight_version,
            elapsed,
            s.counter.bytes_copied,
        )
        return {"version": engine.weight_version, "seconds": elapsed, **s.counter.to_json()}

    def abort(self) -> None:
        self.state.updating = False


def parameter_digests(engine: Any) -> dict[str, str]:
    return {n: digest(t) for n, t in engine_parameters(engine.model).items()}
