"""Filesystem fallback: `<dir>/v<version>/model.safetensors`, then a `COMPLETE` marker written last (by an
atomic rename), so a reader never takes a half-written version. The engine maps the file and copies each
tensor from the mapping into its parameter in place (one model-sized copy; the sender's one copy is the
serialisation to the file)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vriksha.weights.counters import CopyCounter
from vriksha.weights.plan import TensorSpec, WeightTransferError, check_sent
from vriksha.weights.protocol import NamedTensors

MARKER = "COMPLETE"
FILE = "model.safetensors"
_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64", "I64": "int64"}


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:08d}"


def latest_complete(root: Path) -> tuple[int, Path] | None:
    """The newest version under `root` whose marker exists (a torn write has none)."""
    best = None
    for d in root.glob("v*"):
        if (d / MARKER).is_file() and d.name[1:].isdigit():
            v = int(d.name[1:])
            if best is None or v > best[0]:
                best = (v, d)
    return best


class FsSender:
    name = "fs"

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = keep

    def init_info(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    def prepare(self, tensors: NamedTensors, counter: CopyCounter, version: int = 0) -> dict[str, Any]:
        from safetensors.torch import save_file

        d = version_dir(self.root, version)
        d.mkdir(parents=True, exist_ok=True)
        (d / MARKER).unlink(missing_ok=True)
        state = {n: t.contiguous() for n, t in tensors}
        save_file(state, str(d / FILE))
        size = (d / FILE).stat().st_size
        counter.add(sum(t.nbytes for t in state.values()))
        counter.bytes_moved += size
        tmp = d / (MARKER + ".tmp")
        tmp.write_text(json.dumps({"version": version, "bytes": size}))
        os.replace(tmp, d / MARKER)
        self._prune(version)
        return {"dir": str(d), "version": version}

    def transmit(self, tensors: NamedTensors, counter: CopyCounter) -> None:
        return None

    def _prune(self, version: int) -> None:
        for d in self.root.glob("v*"):
            if d.name[1:].isdigit() and int(d.name[1:]) <= version - self.keep:
                for f in d.iterdir():
                    f.unlink(missing_ok=True)
                d.rmdir()

    def close(self) -> None:
        return None


def read_header(path: Path) -> tuple[int, dict]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightTransferError(f"{path} is not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise WeightTransferError(f"{path}: its header claims {n} bytes of a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise WeightTransferError(f"{path}: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise WeightTransferError(f"{path}: its header is not a JSON object")
    return 8 + n, header


def file_specs(path: Path, target: Mapping[str, torch.Tensor]) -> tuple[int, list[tuple[TensorSpec, int]]]:
    """The tensors of a safetensors file with their byte offsets, each checked against the engine's parameter
    of its name (dtype, shape) and against the file's bounds, before any byte is copied."""
    start, header = read_header(path)
    room = path.stat().st_size - start
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES.get(meta["dtype"])
            shape = tuple(int(x) for x in meta["shape"])
            a, b = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WeightTransferError(
                f"{path}: tensor {name!r} has a malformed header entry ({exc!r})"
            ) from None
        if dtype is None:
            raise WeightTransferError(f"{path}: tensor {name!r} has unsupported dtype {meta['dtype']}")
        spec = TensorSpec(name, dtype, shape)
        if not 0 <= a <= b <= room or b - a != spec.nbytes:
            raise WeightTransferError(
                f"{path}: tensor {name!r} has bytes {a}..{b}, not {spec.nbytes} in the file"
            )
        out.append((spec, a))
    check_sent([spec for spec, _ in out], target)
    return start, out


class FsReceiver:
    name = "fs"

    def receive(
        self, info: dict[str, Any], target: dict[str, torch.Tensor], counter: CopyCounter
    ) -> list[str]:
        d = Path(str(info["dir"]))
        if not (d / MARKER).is_file():
            raise WeightTransferError(f"{d} has no {MARKER} marker: the version is incomplete; send it again")
        return [s.name for s in load_file_into(d / FILE, target, counter)]

    def close(self) -> None:
        return None


def load_file_into(path: Path, target: Mapping[str, torch.Tensor], counter: CopyCounter) -> list[TensorSpec]:
    """Copy every tensor of a safetensors file into `target` in place, through a read-only mapping; the whole
    file is checked first (`file_specs`)."""
    start, entries = file_specs(path, target)
    size = path.stat().st_size
    buf = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    for spec, a in entries:
        raw = buf[start + a : start + a + spec.nbytes]
        if (start + a) % spec.torch_dtype.itemsize:
            raw = raw.clone()  # unaligned in the file: one extra copy, counted
            counter.add(spec.nbytes)
        target[spec.name].copy_(raw.view(spec.torch_dtype).view(spec.shape))
        counter.add(spec.nbytes)
    counter.bytes_moved += size
    return [spec for spec, _ in entries]


def restore_latest(engine: Any, root: Path) -> int | None:
    """Load the newest complete version under `root` into `engine`'s parameters in place (a server restarted
    after a crash mid-update takes the last version whose marker was written, never a torn one)."""
    found = latest_complete(Path(root))
    if found is None:
        return None
    version, d = found
    target = {n: p.data for n, p in engine.model.named_parameters()}
    with torch.no_grad():
        load_file_into(d / FILE, target, CopyCounter())
    engine.set_weight_version(version)
    return version
