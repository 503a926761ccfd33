"""Scaling out, measured on one machine: torchrun "nodes" over loopback, and the Ray launcher on a local cluster of
two simulated nodes. The model is the tests' tiny digit model (tests/train/conftest.py): the figures are the
launchers' own costs, not a model's.

torchrun (`--part torchrun`): the same config (colocated rollouts) as 1 node x 2 processes and as 2 nodes x 1
process (each node its own mount and IPC namespace, /dev/shm and TMPDIR: tests/launch/nodes.py): seconds per step
(steps after the first), the engine's weight sync; then server mode, rank 0 pushing to one `vriksha serve` in this
namespace, from 1 node x 2 processes (the same node) and from 2 nodes x 1 process (other nodes): the plane `auto`
chose and seconds per push.

Ray (`--part ray`): a local run (rollout server started by the trainer, environments in the trainer) against
`--launcher ray` on two simulated nodes (trainer and environment server on one, rollout server and router on the
other): wall time, the Ray run's start-up (placement, each service, trainer start from launch.jsonl), the metrics'
largest differences, then the recovery after the rollout actor is killed mid-run (kill -> its restart at its URL ->
the trainer's re-sync push written).

    python benchmarks/scale_out.py --part torchrun --steps 4
    python benchmarks/scale_out.py --part ray --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.launch.nodes import node_env, own_node  # noqa: E402
from tests.train.trainer_runs import metrics_rows, read_rows, write_config  # noqa: E402
from vriksha.net.launch import free_port  # noqa: E402
from vriksha.net.trust import WEIGHTS_KEY_ENV, new_key  # noqa: E402

LAUNCH = {
    "trainer": {"num_cpus": 1, "resources": {"node_a": 1}},
    "env": {"replicas": 1, "num_cpus": 0.5, "resources": {"node_a": 1}},
    "rollout": {"replicas": 1, "num_cpus": 1, "resources": {"node_b": 1}},
    "router": {"num_cpus": 0.5, "resources": {"node_b": 1}},
}


def tiny_model(tmp: Path) -> Path:
    from tests.train.conftest import digit_model_dir

    return digit_model_dir(tmp / "model")


def env(tmpdir: Path | None = None, **extra: str) -> dict[str, str]:
    return node_env(tmpdir, PYTHONPATH=str(REPO), **extra)


def train(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vriksha.cli", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)  # fmt: skip


def finish(p: subprocess.Popen) -> float:
    _, err = p.communicate(timeout=3600)
    if p.returncode != 0:
        raise SystemExit(err[-6000:])
    return 0.0


def step_times(out: Path) -> dict[str, float]:
    rows = read_rows(out)[1:]  # the first step pays for warm-up
    return {
        "s_per_step": statistics.mean(r["time/step_s"] for r in rows),
        "sync_s": statistics.mean(r["time/sync_s"] for r in rows),
    }


def pushes(out: Path) -> dict[str, object]:
    rows = [json.loads(x) for x in (out / "weight_sync.jsonl").read_text().splitlines()]
    return {"plane": sorted({r["backend"] for r in rows}), "s_per_push": statistics.mean(r["seconds"] for r in rows[1:]
            or rows), "pushes": len(rows)}  # fmt: skip


def two_nodes(cfg: Path, tmp: Path, extra: list[str]) -> float:
    port = free_port()
    t0 = time.monotonic()
    procs = [
        train(
            [
                str(cfg),
                "--nnodes",
                "2",
                "--node-rank",
                str(r),
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--nproc",
                "1",
                *extra,
            ],
            env=env(tmp / f"node{r}-tmp"),
            preexec_fn=own_node(),
        )  # fmt: skip
        for r in range(2)
    ]
    for p in procs:
        finish(p)
    return time.monotonic() - t0


def part_torchrun(tmp: Path, steps: int) -> dict:
    model = tiny_model(tmp)
    out: dict = {}
    base = {
        "steps": steps,
        "eval_episodes": 0,
        "export": False,
        "checkpoint_interval": 0,
        "checkpoint_at_end": False,
    }
    cfg = write_config(tmp, model, "one", **base)
    t0 = time.monotonic()
    finish(train([str(cfg), "--nproc", "2"], env=env()))
    out["1 node x 2 processes, colocated"] = {"wall_s": time.monotonic() - t0, **step_times(tmp / "one")}
    cfg = write_config(tmp, model, "two", **base)
    out["2 nodes x 1 process, colocated"] = {"wall_s": two_nodes(cfg, tmp, []), **step_times(tmp / "two")}
    # server mode: one server in this namespace; 1 node x 2 processes share its node, 2 nodes x 1 process do not
    from tests.server.conftest import ServerProcess

    server = ServerProcess(["--model", str(model), "--kv-cache-memory-gb", "0.05"], tmp / "server.log")
    try:
        for name, nodes in (("srv_one", 1), ("srv_two", 2)):
            cfg = write_config(tmp, model, name, **base)
            extra = ["--set", "rollout.mode=server", "--set", f"rollout.servers=[{server.base_url}]"]
            t0 = time.monotonic()
            if nodes == 1:
                finish(train([str(cfg), "--nproc", "2", *extra], env=env()))
                wall = time.monotonic() - t0
                label = "1 node x 2 processes, server mode, server on this node"
            else:
                wall = two_nodes(cfg, tmp, extra)
                label = "2 nodes x 1 process, server mode, server on a third node"
            out[label] = {"wall_s": wall, **step_times(tmp / name), **pushes(tmp / name)}
    finally:
        server.stop()
    return out


def _diffs(a: list[dict], b: list[dict]) -> dict[str, float]:
    worst: dict[str, float] = {}
    for x, y in zip(a, b, strict=True):
        for k, v in x.items():
            if isinstance(v, int | float) and v != y.get(k):
                worst[k] = max(worst.get(k, 0.0), abs(float(v) - float(y[k])))
    return worst


def part_ray(tmp: Path, steps: int) -> dict:
    import ray
    import yaml
    from ray.cluster_utils import Cluster

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    model = tiny_model(tmp)
    out: dict = {}

    def config(name: str) -> Path:
        path = write_config(tmp, model, name, steps=steps, eval_episodes=0, export=False)
        cfg = yaml.safe_load(path.read_text())
        cfg["rollout"]["group_size"] = 4
        cfg["grpo"]["importance_correction"] = (
            False  # the trainer's numbers then do not see the engine's last bits
        )
        cfg["launch"] = {"ray": LAUNCH}
        path.write_text(yaml.safe_dump(cfg))
        return path

    t0 = time.monotonic()
    finish(train([str(config("local")), "--set", "rollout.mode=server"], env=env()))
    out["local (server mode)"] = {"wall_s": time.monotonic() - t0, **step_times(tmp / "local")}
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"node_a": 10},
                                                              "include_dashboard": False})  # fmt: skip
    cluster.add_node(num_cpus=2, resources={"node_b": 10})
    cluster.wait_for_nodes()
    out["cluster start (2 simulated nodes), s"] = time.monotonic() - t0
    ray.init(address=cluster.address, namespace="vriksha")
    renv = env(RAY_ADDRESS=cluster.address)
    try:
        t0 = time.monotonic()
        finish(train([str(config("ray")), "--launcher", "ray"], env=renv))
        events = [json.loads(x) for x in (tmp / "ray" / "launch.jsonl").read_text().splitlines()]
        out["ray"] = {
            "wall_s": time.monotonic() - t0,
            **step_times(tmp / "ray"),
            "startup": {
                e["event"] + (f" {e['role']}" if "role" in e else ""): e.get("seconds", e["t"])
                for e in events
                if e["event"] in ("placed", "started", "trainers")
            },  # fmt: skip
            "metric differences to local (max abs)": _diffs(
                metrics_rows(tmp / "ray"), metrics_rows(tmp / "local")
            ),
        }
        p = train([str(config("kill")), "--launcher", "ray"], env=renv)
        sync = tmp / "kill" / "weight_sync.jsonl"
        while not sync.exists() or len(sync.read_text().splitlines()) < 2:
            time.sleep(0.05)
        info = ray.get(ray.get_actor("vriksha-rollout-0", namespace="vriksha").describe.remote())
        rows_before = len(sync.read_text().splitlines())
        t_kill = time.monotonic()
        os.kill(info["pid"], signal.SIGKILL)
        while len(sync.read_text().splitlines()) <= rows_before:
            time.sleep(0.05)
        resynced = time.monotonic() - t_kill
        finish(p)
        events = [json.loads(x) for x in (tmp / "kill" / "launch.jsonl").read_text().splitlines()]
        out["ray, rollout actor killed"] = {
            "kill to re-synced push, s": resynced,
            "actor restart (to healthy), s": next(e["seconds"] for e in events if e["event"] == "restarted"),
            "metric differences to local (max abs)": _diffs(
                metrics_rows(tmp / "kill"), metrics_rows(tmp / "local")
            ),
        }
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("torchrun", "ray"), required=True)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault(
        WEIGHTS_KEY_ENV, new_key()
    )  # servers' weight endpoints open to these trainers alone
    with tempfile.TemporaryDirectory(prefix="vriksha-scale-out-") as d:
        fn = part_torchrun if args.part == "torchrun" else part_ray
        print(json.dumps(fn(Path(d), args.steps), indent=2))


if __name__ == "__main__":
    main()
