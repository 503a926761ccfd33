"""Re-validate a dataset: every task's oracle must score 1.0 and its untouched workspace 0."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from vriksha.repo2env.dataset import Dataset
from vriksha.repo2env.errors import Repo2EnvError
from vriksha.repo2env.grading import verify

logger = logging.getLogger(__name__)

__all__ = ["TaskCheck", "validate_dataset"]


@dataclass(slots=True)
class TaskCheck:
    task_id: str
    oracle_resolved: bool
    empty_resolved: bool
    oracle: dict = field(default_factory=dict)
    empty: dict = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.oracle_resolved
            and not self.empty_resolved
            and not self.error
            and self.empty.get("f2p_passed", 1) == 0
            and self.empty.get("p2p_failed", 1) == 0
        )


def validate_dataset(
    root: Path | str, *, progress: bool = True, task_ids: list[str] | None = None
) -> list[TaskCheck]:
    ds = Dataset(root)
    checks = []
    for tid in tqdm(task_ids or ds.task_ids, desc="validate", unit="task", disable=not progress):
        try:
            task = ds.task(tid)
            venv = ds.venv(task.meta.venv_key)
            oracle = verify(task, venv, solution=True)
            empty = verify(task, venv)
            checks.append(TaskCheck(tid, oracle.resolved, empty.resolved, oracle.summary(), empty.summary()))
        except Repo2EnvError as exc:
            checks.append(TaskCheck(tid, False, False, error=str(exc)))
    return checks
