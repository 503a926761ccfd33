"""trainer.checkpoint_at_end: false writes no checkpoint for a finished run, but one stopped early still
gets its checkpoint (so it can resume). The real trainer in a subprocess on the tiny model."""

from __future__ import annotations

import pytest

from tests.train.test_checkpoint_resume import _train
from tests.train.trainer_runs import metrics_rows, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHORT = {
    "steps": 2,
    "eval_episodes": 0,
    "checkpoint_interval": 0,
    "checkpoint_at_end": False,
    "export": False,
}


def test_a_finished_run_writes_no_checkpoint(tiny_model_dir, tmp_path):
    proc = _train([str(write_config(tmp_path, tiny_model_dir, "done", **SHORT))])
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "done"
    assert [row["step"] for row in metrics_rows(out)] == [1, 2]
    assert not list(out.glob("checkpoints/step_*"))
    assert (out / "summary.json").is_file()


def test_a_run_stopped_early_is_still_checkpointed(tiny_model_dir, tmp_path):
    proc = _train([str(write_config(tmp_path, tiny_model_dir, "stopped", **SHORT, stop_after=1))])
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "stopped"
    assert [p.name for p in out.glob("checkpoints/step_*")] == ["step_000001"]
