"""Runs of the real trainer (`python -m vriksha.train` in a subprocess) on a tiny model: their config, the run
(to the end, or killed once a checkpoint is written) and the logs they leave."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vriksha.train.metrics import MEASURED_PREFIXES

ROOT = Path(__file__).resolve().parents[2]
TIMING = MEASURED_PREFIXES


def write_config(tmp: Path, model_dir: Path, name: str, **trainer) -> Path:
    """`tmp/NAME.yaml`: arithmetic episodes on `model_dir`, output in `tmp/NAME`; `trainer` overrides."""
    import yaml

    cfg = {
        "model": {"path": str(model_dir), "mixed_precision": "none"},  # the runs compared here are fp32
        "env": {"name": "arithmetic", "options": {"level": 1}},
        "rollout": {
            "group_size": 8,
            "prompts_per_step": 4,
            "max_new_tokens": 1,
            "engine": {"kv_cache_memory_gb": 0.05},
        },
        "optim": {"lr": 2.0e-4, "max_grad_norm": 10.0},
        "grpo": {"micro_batch_groups": 1},
        "trainer": {
            "steps": 4,
            "seed": 3,
            "eval_episodes": 4,
            "eval_interval": 2,
            "checkpoint_interval": 2,
            "output_dir": str(tmp / name),
            "tensorboard": False,
            "progress": False,
            **trainer,
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(threads: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_trainer(args: list[str], nproc: int = 1) -> None:
    """The trainer to its end (under torchrun with `nproc` > 1); fails the test unless it exits 0."""
    env = _env("1" if nproc > 1 else os.environ.get("OMP_NUM_THREADS", "2"))
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd += ["-m", "vriksha.train", *args]
    else:
        cmd = [sys.executable, "-m", "vriksha.train", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def kill_at_checkpoint(args: list[str], out: Path, step: int = 2, timeout_s: float = 300.0) -> int:
    """Start the trainer and SIGKILL it as soon as step `step`'s checkpoint is complete; its exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vriksha.train", *args],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not (out / "checkpoints" / f"step_{step:06d}" / "manifest.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"the run ended before step {step}"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    return proc.returncode


def read_rows(out: Path, log: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(x) for x in (out / log).read_text().splitlines()]


def without_timing(records: list[dict]) -> list[dict]:
    """The records without the measured times (what two equal runs still differ in)."""
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def metrics_rows(out: Path) -> list[dict]:
    return without_timing(read_rows(out))


def eval_rows(out: Path) -> list[dict]:
    return without_timing(read_rows(out, "eval.jsonl"))
