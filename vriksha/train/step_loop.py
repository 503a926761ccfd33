"""The step loop's bookkeeping, shared by the GRPO and SFT trainers: which steps a run takes (after the one it
resumed from, up to `trainer.steps` or `trainer.stop_after` steps), its progress bar, the running time stamped
on each metrics row, and when it checkpoints."""

from __future__ import annotations

from typing import Any

from vriksha.train.config import TrainerConfig


def step_range(tc: TrainerConfig, start_step: int) -> range:
    stop_at = tc.steps if tc.stop_after is None else min(tc.steps, start_step + tc.stop_after)
    return range(start_step + 1, stop_at + 1)


def progress_bar(tc: TrainerConfig, start_step: int, desc: str, main_rank: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=tc.steps,
        initial=start_step,
        desc=desc,
        unit="step",
        disable=not (main_rank and tc.progress),
        dynamic_ncols=True,
    )


def stamp(row: dict[str, Any], elapsed: float, precision: str) -> float:
    """Add the run's training time so far (resumed runs included) and precision to `row`; the new total."""
    elapsed += row["time/step_s"]
    row["time/elapsed_s"] = elapsed
    row["precision"] = precision
    return elapsed


def checkpoint_due(tc: TrainerConfig, step: int, steps: range) -> bool:
    """A periodic checkpoint; the last step of `steps` is left to `checkpoint_at_end`."""
    return bool(tc.checkpoint_interval) and step % tc.checkpoint_interval == 0 and step < steps.stop - 1


def checkpoint_at_end(tc: TrainerConfig, step: int, start_step: int, resumed: bool) -> bool:
    """Whether the run checkpoints where it stopped: always when stopped early, at the end when asked to."""
    finished = step == tc.steps
    return (step > start_step or not resumed) and (tc.checkpoint_at_end or not finished)
