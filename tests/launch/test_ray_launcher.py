"""`vriksha train --launcher ray` on a local Ray cluster of two simulated nodes (CPU only): the trainer and the
environment server on one, the rollout server and the router on the other, placed by the config's resources.
The same seeds give the local run's metrics; a killed rollout actor is started again at its URL and re-synced,
and the run goes on to the same metrics; a killed trainer stops the job, and --resume continues it.

Equal means every metric the trainer computes bit for bit, and the engine's log-prob gap (engine against trainer
log-probs) to 1e-5: the runs weigh no token by pi_old / pi_engine (`grpo.importance_correction=false`), because
a server's log-probs of one request differ in their last bits between two runs of the same config (local against
local too; the tokens do not), and through that weight the parameters would drift by about 1e-5 a step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.trainer_runs import ROOT, metrics_rows, write_config

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

ENGINE_LOGPROBS = "logprob_gap/mean"
LAUNCH = {
    "trainer": {"num_cpus": 1, "resources": {"node_a": 1}},
    "env": {"replicas": 1, "num_cpus": 0.5, "resources": {"node_a": 1}},
    "rollout": {"replicas": 1, "num_cpus": 1, "resources": {"node_b": 1}},
    "router": {"num_cpus": 0.5, "resources": {"node_b": 1}},
    "startup_timeout_s": 300,
}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # Ray's agents start as Python processes: without cached bytecode each compiles Ray from source on start
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"node_a": 10}, "include_dashboard": False},
    )
    c.add_node(num_cpus=2, resources={"node_b": 10})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="vriksha")
    yield c
    ray.shutdown()
    c.shutdown()


def _config(tmp: Path, model_dir: Path, name: str, **trainer) -> Path:
    import yaml

    path = write_config(tmp, model_dir, name, **{"steps": 6, "eval_episodes": 0, "export": False, **trainer})
    cfg = yaml.safe_load(path.read_text())
    cfg["rollout"]["group_size"] = 4
    cfg["grpo"]["importance_correction"] = False
    cfg["launch"] = {"ray": LAUNCH}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(args: list[str], cluster=None) -> subprocess.Popen:
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    if cluster is not None:
        env["RAY_ADDRESS"] = cluster.address
    return subprocess.Popen([sys.executable, "-m", "vriksha.cli", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _finish(p: subprocess.Popen, ok: bool = True) -> str:
    out, err = p.communicate(timeout=900)
    if ok:
        assert p.returncode == 0, err[-8000:]
    return err


def _same(mine: list[dict], theirs: list[dict]) -> None:
    assert [r["step"] for r in mine] == [r["step"] for r in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert a[ENGINE_LOGPROBS] == pytest.approx(b[ENGINE_LOGPROBS], abs=1e-5)
        assert {k: v for k, v in a.items() if k != ENGINE_LOGPROBS} == {
            k: v for k, v in b.items() if k != ENGINE_LOGPROBS
        }


def _events(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "launch.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def local_run(tiny_model_dir, tmp_path_factory):
    """The same config on this host: a rollout server the trainer starts, the environment in the trainer."""
    tmp = tmp_path_factory.mktemp("local")
    _finish(_train([str(_config(tmp, tiny_model_dir, "local")), "--set", "rollout.mode=server"]))
    return tmp / "local"


def test_ray_places_the_roles_and_matches_the_local_run(cluster, local_run, tiny_model_dir, tmp_path):
    _finish(_train([str(_config(tmp_path, tiny_model_dir, "ray")), "--launcher", "ray"], cluster))
    out = tmp_path / "ray"
    _same(metrics_rows(out), metrics_rows(local_run))
    events = _events(out)
    started = {e["role"]: e["url"] for e in events if e["event"] == "started"}
    assert set(started) == {"env", "rollout", "router"}
    assert [e["event"] for e in events][-2:] == ["finished", "stopped"]
    pushes = [json.loads(x) for x in (out / "weight_sync.jsonl").read_text().splitlines()]
    assert {p["server"] for p in pushes} == {started["rollout"]}
    assert not ray.util.placement_group_table() or all(
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values()
    )


def _wait_for(path: Path, p: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert p.poll() is None, p.communicate()[1][-6000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def test_killed_rollout_actor_is_restarted_resynced_and_the_run_unchanged(cluster, local_run, tiny_model_dir,
                                                                          tmp_path):  # fmt: skip
    out = tmp_path / "kill"
    p = _train([str(_config(tmp_path, tiny_model_dir, "kill")), "--launcher", "ray"], cluster)
    pushes = out / "weight_sync.jsonl"
    deadline = time.monotonic() + 600
    while not pushes.exists() or len(pushes.read_text().splitlines()) < 2:  # the server holds version 1
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-6000:]
        time.sleep(0.1)
    info = ray.get(ray.get_actor("vriksha-rollout-0", namespace="vriksha").describe.remote())
    os.kill(info["pid"], signal.SIGKILL)  # the actor's process dies; its server with it
    _finish(p)
    _same(metrics_rows(out), metrics_rows(local_run))
    events = _events(out)
    assert [e["role"] for e in events if e["event"] == "died"] == ["rollout"]
    (restart,) = [e for e in events if e["event"] == "restarted"]
    assert restart["url"] == info["url"]  # the same node and port
    rows = [json.loads(x) for x in pushes.read_text().splitlines()]
    # the restarted server came back with its initial weights (version 0) and was pushed the current version
    assert any(
        r["server_version_before"] < max(q["version"] for q in rows[:i]) for i, r in enumerate(rows) if i
    )


def test_killed_trainer_stops_the_job_and_resume_continues(cluster, tiny_model_dir, tmp_path):
    cfg = _config(tmp_path, tiny_model_dir, "resume", checkpoint_interval=1)
    out = tmp_path / "resume"
    p = _train([str(cfg), "--launcher", "ray"], cluster)
    _wait_for(out / "checkpoints" / "step_000002" / "manifest.json", p)
    ray.kill(ray.get_actor("vriksha-trainer-0", namespace="vriksha"))
    err = _finish(p, ok=False)
    assert p.returncode == 1
    assert "trainer rank 0 died" in err and "--resume" in err and "step_00000" in err
    assert [e["event"] for e in _events(out)][-1] == "stopped"
    _finish(_train([str(cfg), "--launcher", "ray", "--resume"], cluster))
    rows = metrics_rows(out)
    assert [r["step"] for r in rows][-1] == 6 and len({r["step"] for r in rows}) == 6


def test_fleet_on_ray_serves_through_its_router_and_restarts_a_replica(cluster, tiny_model_dir):
    from openai import OpenAI

    env = dict(os.environ, RAY_ADDRESS=cluster.address, OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # fmt: skip
    p = subprocess.Popen(
        [sys.executable, "-m", "vriksha.cli", "fleet", "--launcher", "ray", "--replicas", "2", "--replica-cpus",
         "0.5", "--model", str(tiny_model_dir), "--policy", "round_robin", "--port", "0", "--",
         "--kv-cache-memory-gb", "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = p.stdout.readline()
        assert line, p.communicate(timeout=60)[1][-6000:]
        fleet = json.loads(line)
        assert len(fleet["replicas"]) == 2
        client = OpenAI(base_url=f"{fleet['router']}/v1", api_key="x")
        model = client.models.list().data[0].id
        before = client.completions.create(model=model, prompt="1 2 3", max_tokens=4, temperature=0)
        actor = ray.get_actor("vriksha-replica-0", namespace="vriksha")
        info = ray.get(actor.describe.remote())
        os.kill(info["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 300
        while True:  # the fleet starts it again at its URL
            try:
                again = ray.get(
                    ray.get_actor("vriksha-replica-0", namespace="vriksha").describe.remote(), timeout=30
                )
                if again["pid"] != info["pid"]:
                    break
            except (ValueError, ray.exceptions.RayError):
                pass
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.5)
        assert again["url"] == info["url"]
        after = client.completions.create(model=model, prompt="1 2 3", max_tokens=4, temperature=0)
        assert after.choices[0].text == before.choices[0].text
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
    assert p.returncode == 0
