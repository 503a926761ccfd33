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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

logger = logging.getLogger(__name__)

__all__ = [
    "MANIFEST",
    "Manifest",
    "NoManifest",
    "write_manifest",
    "read_manifest",
    "verify",
    "atomic_write_text",
    "REQUIRED_FILES",
]

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20
REQUIRED_FILES = ("trainer.json", ".metadata")  # every complete checkpoint has them
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(slots=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, dict[str, Any]]  # relative path -> {"bytes", "sha256"}


@dataclass(slots=True)
class NoManifest:
    """Why a checkpoint has no manifest to trust: none was written (a save cut short, or a checkpoint
    older than manifests), or the file is there but cannot be read (`unreadable`: never to be
    mistaken for the first, which would turn verification off)."""

    reason: str
    unreadable: bool = False


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


def _entry_problem(name: Any, entry: Any) -> str | None:
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in Path(name).parts:
        return f"names a file outside the checkpoint ({name!r})"
    if not isinstance(entry, dict):
        return f"{name}: not a record of bytes and sha256"
    size, digest = entry.get("bytes"), entry.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{name}: bytes is {size!r}, not a size"
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        return f"{name}: sha256 is {digest!r}, not a sha256"
    return None


def _parse(body: Any) -> Manifest:
    """The manifest in `body`; ValueError naming the first thing that is not as `write_manifest` writes it."""
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    if body.get("version") != MANIFEST_VERSION:
        raise ValueError(f"version {body.get('version')!r}, expected {MANIFEST_VERSION}")
    step, world, files = body.get("step"), body.get("world_size"), body.get("files")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step is {step!r}")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world_size is {world!r}")
    if not isinstance(files, dict):
        raise ValueError("files is not a mapping")
    for name, entry in files.items():
        if (problem := _entry_problem(name, entry)) is not None:
            raise ValueError(problem)
    missing = [n for n in REQUIRED_FILES if n not in files]
    if missing:
        raise ValueError(f"lists no {', '.join(missing)} (every checkpoint has them)")
    return Manifest(step=step, world_size=world, files=dict(files))


def read_manifest(path: Path) -> Manifest | NoManifest:
    """The manifest of `path`, or why there is none to trust (`NoManifest.unreadable` when the file
    is there but is not a manifest as `write_manifest` writes it)."""
    file = path / MANIFEST
    if not file.is_file():
        return NoManifest(f"no {MANIFEST}: the save did not finish (a partial checkpoint)")
    try:
        return _parse(json.loads(file.read_text()))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        return NoManifest(f"{file} cannot be read ({type(exc).__name__}: {exc})", unreadable=True)


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
    """Collective: every rank re-hashes its share of the files; returns all problems found (on every
    rank), among them any data file the manifest does not list (added after the save)."""
    rank, world = _world()
    names = sorted(manifest.files)
    mine = [p for n in names[rank::world] if (p := _check(path, n, manifest.files[n])) is not None]
    if rank == 0:
        mine += [
            f"{n} is not in the manifest (added after the save)"
            for n in _data_files(path)
            if n not in manifest.files
        ]
    return sorted(p for part in _gather(mine) for p in part)
