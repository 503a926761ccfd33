"""Checkpoint integrity: a manifest of every file's size and sha256, written last and atomically.

A checkpoint directory is complete when its `manifest.json` exists: the save writes it only after
every rank's files are on disk (and fsync'd), through a temporary file and a rename, so a run
killed while saving leaves a directory without one. `verify` re-hashes the files and names each
one that is missing, truncated or changed. Both sides split the files over the ranks, so a large
checkpoint is hashed in parallel.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST", "Manifest", "write_manifest", "read_manifest", "verify", "atomic_write_text"]

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20


@dataclass(slots=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, dict[str, Any]]  # relative path -> {"bytes", "sha256"}


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(obj: Any) -> list[Any]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _sha256(path: Path, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
        if sync:
            os.fsync(f.fileno())  # the data is on disk before the manifest says it is
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old content or the new, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


def _data_files(path: Path) -> list[str]:
    return sorted(
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST)
    )


def write_manifest(path: Path, step: int) -> None:
    """Collective: hash (and fsync) this checkpoint's files, then rank 0 writes the manifest."""
    rank, world = _world()
    names = _data_files(path) if rank == 0 else None
    if dist.is_initialized() and world > 1:
        box = [names]
        dist.broadcast_object_list(box, src=0)
        names = box[0]
    assert names is not None
    mine = {
        n: {"bytes": (path / n).stat().st_size, "sha256": _sha256(path / n, sync=True)}
        for n in names[rank::world]
    }
    parts = _gather(mine)
    if rank == 0:
        files = {k: v for part in parts for k, v in part.items()}
        body = {
            "version": MANIFEST_VERSION,
            "step": step,
            "world_size": world,
            "files": dict(sorted(files.items())),
        }
        atomic_write_text(path / MANIFEST, json.dumps(body, indent=1))


def read_manifest(path: Path) -> Manifest | str:
    """The manifest of `path`, or a sentence saying why there is none to trust."""
    file = path / MANIFEST
    if not file.is_file():
        return f"no {MANIFEST}: the save did not finish (a partial checkpoint)"
    try:
        body = json.loads(file.read_text())
        return Manifest(step=int(body["step"]), world_size=int(body["world_size"]), files=dict(body["files"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})"


def _check(path: Path, name: str, entry: dict[str, Any]) -> str | None:
    file = path / name
    if not file.is_file():
        return f"{name} is missing"
    size = file.stat().st_size
    if size != entry.get("bytes"):
        return f"{name} has {size} bytes, the manifest says {entry.get('bytes')} (truncated or rewritten)"
    if _sha256(file) != entry.get("sha256"):
        return f"{name} does not match its sha256 (corrupt)"
    return None


def verify(path: Path, manifest: Manifest) -> list[str]:
    """Collective: every rank re-hashes its share of the files; returns all problems found (on every rank)."""
    rank, world = _world()
    names = sorted(manifest.files)
    mine = [p for n in names[rank::world] if (p := _check(path, n, manifest.files[n])) is not None]
    return sorted(p for part in _gather(mine) for p in part)
