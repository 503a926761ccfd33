"""Checkpoints with torch.distributed.checkpoint: sharded model and optimizer, plus what makes a resume exact.

Layout of `<output_dir>/checkpoints/step_<N>/`: the DCP files of {model, optim} (each rank writes
its shards), `trainer.json` (step, scheduler, whether the optimizer had taken a step, metric history:
rank 0), `rng_rank<R>.pt` (every RNG of that rank), and `manifest.json` (size and sha256 of each of
those files), written after them all. `latest` names the newest complete checkpoint and is written
after the manifest, so a run killed while saving resumes from the previous one.

On resume, `find_checkpoint` takes the newest directory whose files match its manifest; a corrupt
or partial one is named in a warning and skipped, and a `latest` that names a missing or bad
directory is rewritten from the listing. A manifest that is there but cannot be read stops the
resume: it is never taken for a checkpoint without one (which would go unverified).

A save that fails (a full disk above all) removes what it wrote and raises one `CheckpointError`
line that says why (`checkpoint_save_errors.py`); the checkpoints before it are untouched.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import vriksha.device as devices
from vriksha.errors import VrikshaError
from vriksha.profiling import phase
from vriksha.train.checkpoint_manifest import (
    NoManifest,
    atomic_write_text,
    read_manifest,
    verify,
    write_manifest,
)
from vriksha.train.checkpoint_save_errors import (
    SaveFailure,
    gather_failures,
    save_error_message,
    tensor_bytes,
)

logger = logging.getLogger(__name__)

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "find_checkpoint", "CheckpointError"]

_STEP_DIR = re.compile(r"step_(\d+)")


class CheckpointError(VrikshaError):
    """No checkpoint to resume from, or one that does not match the run."""


# trainer.json: the optimizer had taken no step when it was saved (its saved state is a placeholder)
FRESH_OPTIMIZER = "optimizer_fresh"


def _no_optimizer_step_yet(optimizer: torch.optim.Optimizer) -> bool:
    """True while `optimizer` holds no state, i.e. before its first step.

    Then `get_state_dict` gives it one by calling `step()` on zero gradients at lr 0 (so that the
    state has every key a later load expects). The parameters do not move, but the step counts:
    AdamW's `step` becomes 1, and the run's first real step would be bias-corrected as its second.
    `save_checkpoint` therefore empties the state again after the save, and `load_checkpoint`
    empties it after loading such a checkpoint, so a run that saves before its first optimizer
    step (a first step whose groups all lacked signal) goes on exactly as one that did not.
    """
    return not optimizer.state


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    accelerator = devices.accelerator_rng_state()
    if accelerator is not None:
        state["accelerator"] = accelerator
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    devices.set_accelerator_rng_state(state.get("accelerator"))


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def _broadcast(obj: Any) -> Any:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _step_of(path: Path) -> int:
    m = _STEP_DIR.fullmatch(path.name)
    return int(m.group(1)) if m else -1


def step_dirs(output_dir: str | Path) -> list[Path]:
    """Every `step_<N>` directory under the checkpoint root, newest (highest N) first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()
    ]
    return [p for _, p in sorted(found, reverse=True)]


def _pointer(output_dir: str | Path) -> str | None:
    marker = checkpoint_root(output_dir) / "latest"
    try:
        return marker.read_text().strip() or None
    except OSError:
        return None


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The directory `latest` names, if it exists (unverified; `find_checkpoint` is what resume uses)."""
    name = _pointer(output_dir)
    if name is None:
        return None
    path = checkpoint_root(output_dir) / name
    return path if path.is_dir() else None


def _legacy_ok(path: Path) -> bool:
    """A checkpoint written before manifests existed: complete if `latest` named it and its files are there."""
    return (path / "trainer.json").is_file() and (path / ".metadata").is_file()


def find_checkpoint(output_dir: str | Path) -> Path:
    """Collective: the newest checkpoint whose files match their manifest.

    Corrupt and partial ones are skipped with a warning that names what is wrong; a `latest`
    pointer that names anything else is rewritten. `CheckpointError` when none is good, listing why.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    root = checkpoint_root(output_dir)
    pointer = _pointer(output_dir)
    names = _broadcast([p.name for p in step_dirs(output_dir)] if rank == 0 else None)
    rejected: list[str] = []
    chosen: Path | None = None
    for name in names:
        path = root / name
        manifest = read_manifest(path)
        if isinstance(manifest, NoManifest) and manifest.unreadable:
            raise CheckpointError(
                f"--resume: {manifest.reason}: {path} cannot be verified, so the resume stops (it never "
                f"goes on unverified); restore the manifest, or move {path} aside to resume from an older "
                "checkpoint"
            )
        if isinstance(manifest, NoManifest):
            if name == pointer and _legacy_ok(path):
                if rank == 0:
                    logger.warning(
                        "checkpoint %s has no manifest (saved by an older version): not verified", path
                    )
                chosen = path
                break
            rejected.append(f"{path}: {manifest.reason}")
            continue
        problems = verify(path, manifest)
        if manifest.step != _step_of(path):
            problems.append(f"its manifest is for step {manifest.step}")
        if problems:
            rejected.append(f"{path}: " + "; ".join(problems))
            continue
        chosen = path
        break
    if rank == 0:
        for why in rejected:
            logger.warning("skipping checkpoint %s", why)
    if chosen is None:
        if not names:
            raise CheckpointError(f"--resume: no checkpoint under {root} (no step_<N> directory)")
        raise CheckpointError(
            f"--resume: no usable checkpoint under {root}: "
            + " | ".join(rejected)
            + "; start without --resume (or move output_dir aside)"
        )
    if rejected and rank == 0:
        logger.warning("resuming from %s, the newest good checkpoint", chosen)
    if pointer != chosen.name and rank == 0:
        if pointer is None or not (root / pointer).is_dir():
            logger.warning(
                "checkpoints/latest names %r, which does not exist; repaired from the directory listing: %s",
                pointer,
                chosen.name,
            )
        atomic_write_text(root / "latest", chosen.name)
    return chosen


def _write_state(
    path: Path, model_sd: dict, optim_sd: dict, state: dict[str, Any] | None, rank: int
) -> SaveFailure | None:
    """This rank's part of a save (collective through DCP); the failure, if any, instead of raising."""
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        torch.save(_rng_state(), path / f"rng_rank{rank}.pt")
        if state is not None:
            (path / "trainer.json").write_text(json.dumps(state))
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        return SaveFailure.of(exc)
    return None


def _check_saved(path: Path, failure: SaveFailure | None, needed: int, rank: int) -> None:
    """Collective: when any rank failed, rank 0 removes the partial save and every rank raises one line."""
    reports = gather_failures(failure, needed, path)
    if not reports:
        return
    last_good = _pointer(path.parent.parent)
    if last_good == path.name or not (path.parent / str(last_good)).is_dir():
        last_good = None
    _barrier()  # every rank has looked at the disk before the partial save goes
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    raise CheckpointError(save_error_message(path, reports, last_good))


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    rank: int,
    keep: int = 2,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory; `CheckpointError` (one line:
    disk full, or what else failed) when it could not be written, with the partial save removed."""
    root = checkpoint_root(output_dir)
    path = root / f"step_{step:06d}"
    with phase("train.checkpoint"):
        if rank == 0 and path.exists():  # left by a save that was cut short: never mix two saves' files
            shutil.rmtree(path)
        _barrier()
        fresh = _no_optimizer_step_yet(optimizer)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        needed = tensor_bytes(model_sd) + tensor_bytes(optim_sd)
        state = None
        if rank == 0:
            state = {
                "step": step,
                "scheduler": scheduler.state_dict(),
                FRESH_OPTIMIZER: fresh,
                **trainer_state,
            }
        failure = _write_state(path, model_sd, optim_sd, state, rank)
        if fresh:
            optimizer.state.clear()  # as it was: the state get_state_dict made for the save is not this run's
        _check_saved(path, failure, needed, rank)
        try:
            write_manifest(path, step)
            failure = None
        except OSError as exc:
            failure = SaveFailure.of(exc)
        _check_saved(path, failure, needed, rank)
        if rank == 0:
            try:
                atomic_write_text(root / "latest", path.name)
            except OSError as exc:  # the checkpoint is complete: a resume finds it by its manifest
                logger.warning("saved %s but could not point checkpoints/latest at it: %s", path, exc)
            old = [p for p in step_dirs(output_dir) if p != path]
            # steps past this one belong to a timeline this run left (a resume skipped them as
            # bad, or a fresh run reuses the directory) and saves without a readable manifest (cut
            # short, from an older version, or damaged) go; of the complete earlier ones the newest
            # keep - 1 stay
            stale = [p for p in old if _step_of(p) > step or isinstance(read_manifest(p), NoManifest)]
            kept = [p for p in old if p not in stale]
            for victim in [*stale, *kept[max(0, keep - 1) :]]:
                shutil.rmtree(victim, ignore_errors=True)
        _barrier()
    logger.info("saved checkpoint %s", path)
    return path


def load_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int
) -> dict[str, Any]:
    """Collective: restore model, optimizer, scheduler and RNG in place; returns the trainer state."""
    state_file = path / "trainer.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no trainer.json)")
    trainer_state = json.loads(state_file.read_text())
    rng_file = path / f"rng_rank{rank}.pt"
    world = dist.get_world_size() if dist.is_initialized() else 1
    resharded = trainer_state.get("world_size", world) != world
    if not rng_file.is_file() and not resharded:
        raise CheckpointError(f"{path} has no RNG state for rank {rank}: the checkpoint is incomplete")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    try:
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if trainer_state.pop(FRESH_OPTIMIZER, False):
            optimizer.state.clear()  # saved before the first optimizer step: resume with none, as the run had
        scheduler.load_state_dict(trainer_state.pop("scheduler"))
        rng = None if resharded else torch.load(rng_file, weights_only=False)
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        lines = str(exc).strip().splitlines() or [""]
        # DCP wraps each rank's error: its last line is the cause
        detail = lines[-1] if isinstance(exc, CheckpointException) else f"{type(exc).__name__}: {lines[0]}"
        raise CheckpointError(
            f"cannot load {path} ({detail[:300]}): it does not match this run's model and optimizer "
            "(was the config changed?) or it is damaged; move it aside to resume from an older one"
        ) from exc
    if resharded:
        # DCP reshards model and optimizer onto this mesh; per-rank RNG streams do not map across
        # world sizes (episodes and sampling are seeded per step, so only dropout-like draws differ)
        logger.warning(
            "checkpoint written by %s processes, resumed on %d: model and optimizer resharded, RNG state not restored",
            trainer_state.get("world_size"),
            world,
        )
    elif rng is not None:
        _set_rng_state(rng)
    logger.info("resumed from %s (step %d)", path, trainer_state["step"])
    return trainer_state
