"""Same-host data plane: one flat buffer in shared memory (/dev/shm), written by the trainer, mapped by the
engine, which copies each tensor from the mapping into its parameter in place.

Copies per update: the sender packs each tensor into the buffer once (one model-sized copy); the receiver
copies each tensor out of the mapping into its parameter once (one model-sized copy). The buffer is made
once and reused by every later update of the same layout.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import torch

from vriksha.weights.counters import CopyCounter
from vriksha.weights.plan import TensorSpec, WeightTransferError, layout, view
from vriksha.weights.protocol import NamedTensors

SHM_DIR = Path("/dev/shm")


def shm_available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _map(path: Path, size: int) -> torch.Tensor:
    return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)


class ShmSender:
    name = "shm"

    def __init__(self, directory: Path = SHM_DIR) -> None:
        self.path = directory / f"vriksha-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._buf: torch.Tensor | None = None
        self._size = 0

    def init_info(self) -> dict[str, Any]:
        return {}

    def prepare(self, tensors: NamedTensors, counter: CopyCounter, version: int = 0) -> dict[str, Any]:
        specs = [TensorSpec.of(n, t) for n, t in tensors]
        offsets, size = layout(specs)
        if self._buf is None or size != self._size:
            self._buf = _map(self.path, size)
            self._size = size
        for (_, t), s, off in zip(tensors, specs, offsets, strict=True):
            view(self._buf, off, s).copy_(t)
            counter.add(s.nbytes)
        counter.bytes_moved += size
        return {"path": str(self.path), "size": size, "specs": [s.to_json() for s in specs]}

    def transmit(self, tensors: NamedTensors, counter: CopyCounter) -> None:
        return None

    def close(self) -> None:
        self._buf = None
        self.path.unlink(missing_ok=True)


class ShmReceiver:
    name = "shm"

    def __init__(self) -> None:
        self._maps: dict[str, tuple[int, torch.Tensor]] = {}

    def receive(
        self, info: dict[str, Any], target: dict[str, torch.Tensor], counter: CopyCounter
    ) -> list[str]:
        path, size = Path(str(info["path"])), int(info["size"])
        if not path.resolve().is_relative_to(SHM_DIR.resolve()) or not path.is_file():
            raise WeightTransferError(f"shared-memory buffer {str(path)!r} is not a file under {SHM_DIR}")
        if path.stat().st_size < size:
            raise WeightTransferError(
                f"shared-memory buffer {str(path)!r} is smaller than the update ({size} B)"
            )
        cached = self._maps.get(str(path))
        if cached is None or cached[0] != size:
            self._maps[str(path)] = cached = (size, _map(path, size))
        buf = cached[1]
        specs = [TensorSpec.from_json(d) for d in info["specs"]]
        offsets, _ = layout(specs)
        for s, off in zip(specs, offsets, strict=True):
            target[s.name].copy_(view(buf, off, s))
            counter.add(s.nbytes)
        counter.bytes_moved += size
        return [s.name for s in specs]

    def close(self) -> None:
        self._maps.clear()
