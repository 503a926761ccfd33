"""Resume faults with the real trainer (`python -m vriksha.train` in a subprocess, tiny model):
a corrupt newest checkpoint and a bad `latest` pointer fall back to the newest good checkpoint,
and a trainer killed with -9 resumes; either way the run equals an uninterrupted one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.trainer_runs import eval_rows, metrics_rows, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def _cmd(args: list[str]) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return [sys.executable, "-m", "vriksha.train", *args], env


def _train(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd, env = _cmd(args)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    proc = _train([str(write_config(tmp, tiny_model_dir, "full", export=False))])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / "full"


def test_corrupt_newest_checkpoint_and_bad_pointer_fall_back_and_match(uninterrupted, tmp_path):
    out = tmp_path / "full"
    shutil.copytree(uninterrupted, out)
    cfg = tmp_path / "run.yaml"
    cfg.write_text((uninterrupted.parent / "full.yaml").read_text().replace(str(uninterrupted), str(out)))
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000002", "step_000004"]
    shard = max((ckpts / "step_000004").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x5A
    shard.write_bytes(bytes(data))
    (ckpts / "latest").write_text("step_000006")  # names a step that does not exist
    proc = _train([str(cfg), "--resume"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    err = proc.stderr
    assert "Traceback" not in err
    assert f"step_000004: {shard.name} does not match its sha256" in err
    assert "'step_000006', which does not exist" in err and "repaired" in err
    assert "resuming from" in err and "step_000002" in err
    # steps 3 and 4 ran again from step 2's checkpoint and came out the same
    assert metrics_rows(out) == metrics_rows(uninterrupted)
    assert eval_rows(out) == eval_rows(uninterrupted)
    assert (ckpts / "latest").read_text() == "step_000004"


def test_nothing_usable_is_one_line_not_a_traceback(uninterrupted, tmp_path):
    out = tmp_path / "full"
    shutil.copytree(uninterrupted / "checkpoints", out / "checkpoints")
    cfg = tmp_path / "run.yaml"
    cfg.write_text((uninterrupted.parent / "full.yaml").read_text().replace(str(uninterrupted), str(out)))
    for step_dir in (out / "checkpoints").glob("step_*"):
        (step_dir / "trainer.json").write_text("{}")
    proc = _train([str(cfg), "--resume"])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "no usable checkpoint" in proc.stderr and "step_000002" in proc.stderr


def test_killed_with_sigkill_resumes_equal_to_uninterrupted(uninterrupted, tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "killed", export=False, checkpoint_interval=1)
    out = tmp_path / "killed"
    cmd, env = _cmd([str(cfg)])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        marker = out / "checkpoints" / "step_000002" / "manifest.json"
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint at step 2"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert len(metrics_rows(out)) < 4  # it did not finish
    resumed = _train([str(cfg), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert metrics_rows(out) == metrics_rows(uninterrupted)
    assert eval_rows(out) == eval_rows(uninterrupted)
