"""`vriksha train --set rollout.mode=server`: the trainer starts a `vriksha serve` itself, plays its episodes
there, pushes its weights after each update under advancing versions (bit-equal on the server), and stops
the server at the end."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from tests.train.trainer_runs import kill_at_checkpoint, read_rows, run_trainer, write_config

pytestmark = pytest.mark.slow


def test_server_mode_two_steps_versions_advance_and_weights_match(tiny_model_dir, tmp_path):
    cfg = write_config(
        tmp_path,
        tiny_model_dir,
        "server",
        steps=2,
        eval_episodes=2,
        eval_interval=0,
        checkpoint_interval=0,
        export=False,
    )
    run_trainer(
        [
            str(cfg),
            "--set",
            "rollout.mode=server",
            "--set",
            "rollout.verify_weights=true",
            "--set",
            "rollout.weight_backend=gloo",
            "--set",
            "rollout.weight_bucket_mb=0.5",
        ]
    )
    out = tmp_path / "server"
    metrics = read_rows(out)
    assert [r["step"] for r in metrics] == [1, 2]
    syncs = read_rows(out, "weight_sync.jsonl")
    updates = sum(1 for r in metrics if r["groups/zero_variance"] < r["groups/total"])
    assert updates >= 1, "the tiny digit model should give reward variance"
    # version 0 before step 1, then one push per update that changed the weights
    assert [s["version"] for s in syncs] == list(range(len(syncs)))
    assert len(syncs) >= 1 + min(updates, 1)
    assert all(s["bit_equal"] and s["backend"] == "gloo" for s in syncs)
    assert all(s["server_version_before"] == max(0, s["version"] - 1) for s in syncs)
    assert all(s["receiver"]["bytes_copied"] == s["sender"]["bytes_copied"] for s in syncs)
    # the server the run started is gone
    port = int(syncs[0]["server"].rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert "received SIGTERM" in (out / "server.log").read_text(errors="replace")  # stopped, not killed


def test_server_mode_config_is_validated():
    from vriksha.errors import ConfigError
    from vriksha.train.config import TrainConfig

    cfg = TrainConfig.from_dict({"rollout": {"mode": "server", "servers": ["http://127.0.0.1:9"]}})
    assert cfg.rollout.mode == "server" and cfg.rollout.servers == ["http://127.0.0.1:9"]
    with pytest.raises(ConfigError, match="rollout.mode"):
        TrainConfig.from_dict({"rollout": {"mode": "remote"}})
    assert Path(sys.executable).exists()


def test_killed_trainer_resumes_and_resyncs_the_server(tiny_model_dir, tmp_path, monkeypatch):
    """kill -9 of a server-mode trainer (its transfer never closed), then `--resume`: the same run owns the
    server again, finds it at another version than its checkpoint, re-syncs and finishes."""
    import httpx

    from tests.server.conftest import WEIGHTS, WEIGHTS_KEY, ServerProcess

    monkeypatch.setenv(
        "VRIKSHA_WEIGHTS_KEY", WEIGHTS_KEY
    )  # the server's and the trainers' (a flag would show)
    server = ServerProcess(
        ["--model", str(tiny_model_dir), "--kv-cache-memory-gb", "0.05"], tmp_path / "s.log"
    )
    try:
        cfg = write_config(
            tmp_path,
            tiny_model_dir,
            "resume",
            steps=4,
            eval_episodes=0,
            eval_interval=0,
            checkpoint_interval=1,
            export=False,
        )
        sets = [
            "--set",
            "rollout.mode=server",
            "--set",
            f"rollout.servers=[{server.base_url}]",
            "--set",
            "rollout.verify_weights=true",
        ]
        out = tmp_path / "resume"
        kill_at_checkpoint([str(cfg), *sets], out, step=2)
        state = httpx.get(f"{server.base_url}/weight_version", headers=WEIGHTS, timeout=10).json()
        assert state["owner"] is not None  # the killed run never closed its transfer
        before = len(read_rows(out, "weight_sync.jsonl"))
        run_trainer([str(cfg), "--resume", *sets])
        synced = read_rows(out, "weight_sync.jsonl")[before:]
        assert read_rows(out)[-1]["step"] == 4
        start = synced[0]["version"]
        assert start >= 2  # the resumed step, not the server's last version
        assert synced[0]["server_version_before"] == state["version"]
        assert [r["version"] for r in synced] == list(range(start, start + len(synced)))
        assert all(r["bit_equal"] for r in synced)
        after = httpx.get(f"{server.base_url}/weight_version", headers=WEIGHTS, timeout=10).json()
        assert after["owner"] is None  # closed
    finally:
        server.stop()
