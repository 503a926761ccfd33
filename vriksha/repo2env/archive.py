"""Unpack an archive (an sdist, a task's packed files) within caps on its unpacked size and entry count.

A few megabytes of gzip or deflate can hold gigabytes of zeros, and a tar can hold millions of
empty entries: every byte and entry is counted as it is written (never trusting a header's total
alone), and the unpack stops at the first that goes past a cap, with an error naming the archive
and the cap. Entries that would land outside the destination, links and special files are skipped.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from vriksha.repo2env.errors import SourceError

__all__ = ["UnpackLimits", "extract_tar", "extract_zip", "read_tar_files"]

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class UnpackLimits:
    max_bytes: int = 1 << 30  # 1 GiB unpacked
    max_files: int = 100_000  # entries (files and directories)

    @classmethod
    def from_mb(cls, max_mb: float, max_files: int) -> UnpackLimits:
        return cls(max_bytes=int(max_mb * (1 << 20)), max_files=max_files)


class _Budget:
    """What an unpack has used so far; raises `SourceError` the moment a cap is passed."""

    def __init__(self, limits: UnpackLimits, what: str) -> None:
        self.limits, self.what, self.bytes, self.entries = limits, what, 0, 0

    def count(self, n: int = 1) -> None:
        self.entries += n
        if self.entries > self.limits.max_files:
            raise SourceError(
                f"{self.what} holds more than {self.limits.max_files:,} entries (the cap on unpacked "
                "files): refused as an archive bomb; raise --max-unpacked-files if the archive is trusted"
            )

    def spend(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.limits.max_bytes:
            raise SourceError(
                f"{self.what} unpacks to more than {self.limits.max_bytes / (1 << 20):,.0f} MiB (the cap "
                "on unpacked bytes): refused as an archive bomb; raise --max-unpacked-mb if the archive "
                "is trusted"
            )

    def copy(self, src: IO[bytes], dst: IO[bytes]) -> None:
        while chunk := src.read(_CHUNK):
            self.spend(len(chunk))
            dst.write(chunk)


def _inside(dest: Path, name: str) -> Path | None:
    target = (dest / name).resolve()
    return target if target.is_relative_to(dest.resolve()) and target != dest.resolve() else None


def _members(tf: tarfile.TarFile, budget: _Budget) -> Iterator[tarfile.TarInfo]:
    """The archive's members one at a time (never the whole index in memory), each one counted."""
    for member in tf:
        budget.count()
        yield member


def extract_tar(archive: Path | IO[bytes], dest: Path, limits: UnpackLimits, what: str | None = None) -> None:
    """Unpack the regular files and directories of a tar (any compression) into `dest`, within `limits`."""
    budget = _Budget(limits, what or str(archive))
    opened = (
        tarfile.open(archive, mode="r:*")
        if isinstance(archive, Path)
        else tarfile.open(fileobj=archive, mode="r:*")
    )
    with opened as tf:
        for member in _members(tf, budget):
            target = _inside(dest, member.name)
            if target is None or not (member.isdir() or member.isfile()):
                continue
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tf.extractfile(member) as src, target.open("wb") as out:  # type: ignore[union-attr]
                budget.copy(src, out)


def extract_zip(archive: Path, dest: Path, limits: UnpackLimits, what: str | None = None) -> None:
    """Unpack a zip's files and directories into `dest`, within `limits` (sizes counted as written)."""
    budget = _Budget(limits, what or str(archive))
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        budget.count(len(infos))
        for info in infos:
            target = _inside(dest, info.filename)
            if target is None:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                budget.copy(src, out)


def read_tar_files(data: bytes, limits: UnpackLimits, what: str) -> dict[str, bytes]:
    """The regular files of a gzipped tar held in memory, by relative path, within `limits`."""
    budget = _Budget(limits, what)
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        for member in _members(tf, budget):
            if member.isfile() and not member.name.startswith("/") and ".." not in Path(member.name).parts:
                buf = io.BytesIO()
                with tf.extractfile(member) as src:  # type: ignore[union-attr]
                    budget.copy(src, buf)
                out[member.name] = buf.getvalue()
    return out
