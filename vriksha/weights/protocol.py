"""The data planes' two sides: a sender on the trainer, a receiver on the engine.

Shared memory (`shm.py`), gloo buckets (`gloo.py`) and files (`fs.py`) implement both. An update is a
set of named tensors: every parameter of the model today (the client and the engine's `WeightUpdater`
insist on all of them); a plane moves whatever names it is given, so an update of a model's adapters
alone travels the same way. One update:

    info = sender.prepare(tensors, counter, version)   # lay out / write the bytes; `info` goes over HTTP
    sender.transmit(tensors, counter)                  # while the engine's receive(info, ...) runs
    names = receiver.receive(info, target, counter)    # copy into the engine's tensors in place

Planes that write everything in `prepare` (a mapping, a file) do nothing in `transmit`; a collective
plane (gloo) moves the bytes there, the two sides meeting in the same broadcasts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from vriksha.weights.counters import CopyCounter

__all__ = ["NamedTensors", "WeightReceiver", "WeightSender"]

# (name, tensor) pairs in the order the update lays them out; the receiver's layout follows the same order
NamedTensors = Sequence[tuple[str, torch.Tensor]]


@runtime_checkable
class WeightSender(Protocol):
    name: str  # the plane: "shm", "gloo", "fs"

    def init_info(self) -> dict[str, Any]:
        """What the engine's receiver needs to reach this sender (sent once, at init)."""
        ...

    def prepare(self, tensors: NamedTensors, counter: CopyCounter, version: int = 0) -> dict[str, Any]:
        """Lay out (or write) the update of `version`; returns the receiver's `info` for it."""
        ...

    def transmit(self, tensors: NamedTensors, counter: CopyCounter) -> None:
        """Move the bytes while the receiver runs `receive` (a no-op where `prepare` wrote them)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class WeightReceiver(Protocol):
    name: str

    def receive(
        self, info: dict[str, Any], target: dict[str, torch.Tensor], counter: CopyCounter
    ) -> list[str]:
        """Copy the update `info` describes into `target`'s tensors in place; returns the names written."""
        ...

    def close(self) -> None: ...
