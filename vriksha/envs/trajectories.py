"""Played episodes as JSONL lines (`vriksha env eval --save PATH`): what the model saw and produced as token
ids, with the loss mask (1 on generated tokens) and the scores; `algorithm: sft` trains on them.

    {"env", "model", "split", "seed", "sample" (null: the greedy run; k: the k-th of --samples),
     "temperature", "reward", "success", "turns", "truncated",
     "prompt_ids", "completion_ids", "loss_mask", "completions" (the model's text, one per turn)}

The ids are the playing model's tokenizer's: train on them with a model that shares it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vriksha.envs.play import Episode

__all__ = ["trajectory_row", "write_trajectories"]


def trajectory_row(
    e: Episode, *, env: str, model: str, split: str, sample: int | None, temperature: float
) -> dict[str, Any]:
    return {
        "env": env,
        "model": model,
        "split": split,
        "seed": e.seed,
        "sample": sample,
        "temperature": temperature,
        "reward": e.reward,
        "success": e.success,
        "turns": e.turns,
        "truncated": e.truncated,
        "prompt_ids": list(e.prompt_ids),
        "completion_ids": list(e.completion_ids),
        "loss_mask": list(e.loss_mask),
        "completions": list(e.completions),
    }


def write_trajectories(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write `rows` as JSONL to `path` (its directory made); how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n
