"""Why a checkpoint save failed, in one line: a full disk named as such, anything else by its cause.

A full disk rarely says so: DCP wraps each rank's error in a `CheckpointException` and torch's
writer reports "unexpected pos 704 vs 598", with no errno. So after a failure every rank also looks
at the disk it wrote to: an ENOSPC/EDQUOT anywhere in the error, or less room left than the save
needed, is a full disk. The ranks pool what they saw (`gather_failures`), so each raises the same
sentence.
"""

from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

__all__ = ["SaveFailure", "RankReport", "gather_failures", "save_error_message", "tensor_bytes"]

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_SLACK = 1 << 20  # room a save needs beyond its tensors (metadata, RNG state, manifest)


@dataclass(slots=True)
class SaveFailure:
    detail: str  # "ExceptionType: first line"
    errno: int | None = None

    @classmethod
    def of(cls, exc: BaseException) -> SaveFailure:
        cause = _root_cause(exc)
        lines = str(cause).strip().splitlines() or [""]
        return cls(f"{type(cause).__name__}: {lines[0][:300]}", _errno_in(exc))


@dataclass(slots=True)
class RankReport:
    rank: int
    failure: SaveFailure | None
    needed: int  # bytes this rank had to write
    free: int | None  # bytes free where it wrote, after the failure


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(out) < 32:
        e = todo.pop()
        out.append(e)
        if isinstance(e, CheckpointException):
            todo += [v[0] if isinstance(v, tuple) else v for v in e.failures.values()]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return out


def _root_cause(exc: BaseException) -> BaseException:
    causes = [e for e in _causes(exc) if not isinstance(e, CheckpointException)]
    return causes[0] if causes else exc


def _errno_in(exc: BaseException) -> int | None:
    return next((e.errno for e in _causes(exc) if isinstance(e, OSError) and e.errno), None)


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) state dict held by this rank (a DTensor: its local shard)."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return local.numel() * local.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def gather_failures(failure: SaveFailure | None, needed: int, path: Path) -> list[RankReport]:
    """Collective: every rank's report when any rank failed, else []."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = RankReport(rank, failure, needed, _free_bytes(path) if failure is not None else None)
    if dist.is_initialized() and dist.get_world_size() > 1:
        reports: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(reports, mine)
    else:
        reports = [mine]
    return reports if any(r.failure is not None for r in reports) else []


def _size(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB"


def _disk_full(report: RankReport) -> bool:
    if report.failure is None:
        return False
    if report.failure.errno in _DISK_FULL:
        return True
    return report.free is not None and report.free < report.needed + _SLACK


def save_error_message(path: Path, reports: list[RankReport], last_good: str | None) -> str:
    """One line: what went wrong with the save of `path`, that the partial save is removed, what is intact."""
    failed = [r for r in reports if r.failure is not None]
    full = [r for r in failed if _disk_full(r)]
    if full:
        needed = sum(r.needed for r in reports)
        free = (
            min(r.free for r in full if r.free is not None) if any(r.free is not None for r in full) else None
        )
        room = f"{_size(free)} free" if free is not None else "no room left"
        why = f"disk full ({room} on the file system of {path.parent}; the save needs about {_size(needed)})"
    else:
        first = failed[0]
        why = f"{first.failure.detail} (rank {first.rank})"  # type: ignore[union-attr]
    kept = (
        f"the last good checkpoint, {last_good}, is intact" if last_good else "no earlier checkpoint exists"
    )
    todo = "free some space (or set trainer.output_dir on a larger disk)" if full else "fix the cause"
    return (
        f"cannot save checkpoint {path}: {why}; the partial save was removed and {kept}; "
        f"{todo}, then resume with --resume"
    )
