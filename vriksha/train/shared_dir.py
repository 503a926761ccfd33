"""The output directory must be one file system that every rank sees: each rank writes its shards of a
checkpoint there, and rank 0 its manifest over all of them. Checked once at start, so that nodes with a private
directory each (a node-local /tmp, an unmounted share) are named before the first step, not at the first save."""

from __future__ import annotations

import logging
import secrets
import socket
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["check_shared_dir"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def check_shared_dir(path: Path, rank: int, world_size: int) -> None:
    """Rank 0 writes a token file under `path`, every rank reads it back; a `ConfigError` on every rank names
    the ranks (and their hosts) that do not see it. A no-op for one rank."""
    if world_size == 1 or not dist.is_initialized():
        return
    box = [secrets.token_hex(16) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    token = str(box[0])
    probe = path / f".shared-check-{token[:12]}"
    error = None
    if rank == 0:
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe.write_text(token)
        except OSError as exc:
            error = f"rank 0 cannot write there: {exc}"
    dist.barrier()
    seen = _read(probe) == token
    views: list[Any] = [None] * world_size
    dist.all_gather_object(views, (seen, socket.gethostname(), error))
    dist.barrier()
    if rank == 0:
        probe.unlink(missing_ok=True)
    error = next((v[2] for v in views if v[2]), None)
    blind = [f"{r} (on {host})" for r, (ok, host, _) in enumerate(views) if not ok]
    if error or blind:
        detail = (
            error
            or f"rank{'s' if len(blind) > 1 else ''} {', '.join(blind)} cannot read the file rank 0 wrote"
        )
        raise ConfigError(
            f"trainer.output_dir {str(path)!r} is not one file system that every rank sees: {detail}. Checkpoints "
            "are written there by every rank; give every node the same shared directory (NFS, Lustre, a "
            "mounted bucket) as trainer.output_dir"
        )
    logger.info("output directory %s is shared by all %d ranks", path, world_size)
