"""Checkpoints with torch.distributed.checkpoint: sharded model and optimizer, plus what makes a resume exact.

Layout of `<output_dir>/checkpoints/step_<N>/`: the DCP files of {model, optim} (each rank writes
its shards), `trainer.json` (step, scheduler, metric history: rank 0), `rng_rank<R>.pt` (every RNG
of that rank). `latest` names the newest complete checkpoint; it is written last, so a run killed
while saving resumes from the previous one.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from vriksha.errors import VrikshaError
from vriksha.profiling import phase

logger = logging.getLogger(__name__)

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "CheckpointError"]


class CheckpointError(VrikshaError):
    """No checkpoint to resume from, or one that does not match the run."""


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    marker = checkpoint_root(output_dir) / "latest"
    if not marker.is_file():
        return None
    path = checkpoint_root(output_dir) / marker.read_text().strip()
    return path if path.is_dir() else None


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
    """Collective: every rank calls it. Returns the checkpoint directory."""
    root = checkpoint_root(output_dir)
    path = root / f"step_{step:06d}"
    with phase("train.checkpoint"):
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        torch.save(_rng_state(), path / f"rng_rank{rank}.pt")
        if rank == 0:
            state = {"step": step, "scheduler": scheduler.state_dict(), **trainer_state}
            (path / "trainer.json").write_text(json.dumps(state))
        _barrier()
        if rank == 0:
            (root / "latest.tmp").write_text(path.name)
            (root / "latest.tmp").replace(root / "latest")
            old = sorted(p for p in root.glob("step_*") if p.is_dir() and p != path)
            for stale in old[: max(0, len(old) - (keep - 1))]:
                shutil.rmtree(stale, ignore_errors=True)
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
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(trainer_state.pop("scheduler"))
    if resharded:
        # DCP reshards model and optimizer onto this mesh; per-rank RNG streams do not map across
        # world sizes (episodes and sampling are seeded per step, so only dropout-like draws differ)
        logger.warning(
            "checkpoint written by %s processes, resumed on %d: model and optimizer resharded, RNG state not restored",
            trainer_state.get("world_size"),
            world,
        )
    else:
        _set_rng_state(torch.load(rng_file, weights_only=False))
    logger.info("resumed from %s (step %d)", path, trainer_state["step"])
    return trainer_state
