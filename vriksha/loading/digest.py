"""A file's SHA-256, read once per process for each version of the file."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file at `path` (a rewritten file, of another size or mtime, is read again)."""
    resolved = path.resolve()
    stat = resolved.stat()
    return _sha256(resolved, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
