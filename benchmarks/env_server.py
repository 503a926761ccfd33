"""Environment server throughput: vriksha's server vs openenv-core's, same echo env, same load, one run.

Each server runs in its own subprocess on a loopback port; one plain WebSocket load generator
(the `websockets` package, in this process) opens N concurrent sessions (default 1, 8, 64), resets
each, then sends 50 steps per session back to back, and reports steps/s (all sessions' steps over
the wall time of the step phase) and the p50/p99 latency of one step. vriksha runs with request
ids on every message and heartbeats on (every `--heartbeat-s`, default 1 s, so they fire during
the run); openenv-core runs its own `create_app` with `max_concurrent_envs` = the largest N.

    python benchmarks/env_server.py                     # 1, 8, 64 sessions x 50 steps
    python benchmarks/env_server.py --sessions 64 --steps 200 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
from websockets.asyncio.client import connect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- the two servers


def serve_vriksha(port: int, max_sessions: int, heartbeat_s: float) -> None:
    sys.path.insert(0, ROOT)
    from vriksha.envs.core import Environment, Observation, StepResult
    from vriksha.envs.server import EnvServerConfig, serve

    class EchoEnv(Environment):
        """Echoes the action's text back."""

        name = "echo"
        max_turns = 1_000_000

        def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
            return Observation(text="")

        def _step(self, action: Any) -> StepResult:
            return StepResult(observation=Observation(text=action.text), reward=1.0)

    config = EnvServerConfig(port=port, max_sessions=max_sessions, heartbeat_s=heartbeat_s, mcp=True)
    serve(EchoEnv, config)


def serve_openenv(port: int, max_sessions: int) -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        text: str

    class EchoObservation(Observation):
        text: str = ""

    class EchoEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id="e", step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> EchoObservation:
            self._state = State(episode_id=episode_id or "e", step_count=0)
            return EchoObservation(text="")

        def step(self, action: EchoAction, timeout_s: float | None = None, **kw: Any) -> EchoObservation:
            self._state.step_count += 1
            return EchoObservation(text=action.text, reward=1.0)

        @property
        def state(self) -> State:
            return self._state

    app = create_app(EchoEnv, EchoAction, EchoObservation, max_concurrent_envs=max_sessions)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")  # its defaults


# ---------------------------------------------------------------- load generator


async def _vriksha_session(
    url: str, steps: int, start: asyncio.Event, lat: list[float], ready: list[int]
) -> None:
    async with connect(url + "/v1/ws", max_size=None, compression=None) as ws:
        hello = json.loads(await ws.recv())
        assert hello["event"] == "hello", hello
        await ws.send('{"id":0,"op":"reset","seed":0}')
        await _answer(ws, 0)
        ready.append(1)
        await start.wait()
        for i in range(1, steps + 1):
            t0 = time.perf_counter()
            await ws.send(f'{{"id":{i},"op":"step","action":{{"text":"hello"}}}}')
            await _answer(ws, i)
            lat.append(time.perf_counter() - t0)
        await ws.send('{"id":-1,"op":"close"}')
        await _until_closed(ws)


async def _until_closed(ws: Any) -> None:
    """Let the server close first (each server's clean path), skipping any last messages."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 5.0)
    except Exception:
        return


async def _answer(ws: Any, rid: int) -> dict[str, Any]:
    while True:
        msg = json.loads(await ws.recv())
        if msg.get("id") == rid:
            if not msg.get("ok"):
                raise RuntimeError(f"server error: {msg}")
            return msg
        # heartbeats and other events are skipped, as a real client does


async def _openenv_session(
    url: str, steps: int, start: asyncio.Event, lat: list[float], ready: list[int]
) -> None:
    async with connect(url + "/ws", max_size=None, compression=None) as ws:
        await ws.send('{"type":"reset","data":{}}')
        json.loads(await ws.recv())
        ready.append(1)
        await start.wait()
        for _ in range(steps):
            t0 = time.perf_counter()
            await ws.send('{"type":"step","data":{"text":"hello"}}')
            msg = json.loads(await ws.recv())
            if msg.get("type") != "observation":
                raise RuntimeError(f"server error: {msg}")
            lat.append(time.perf_counter() - t0)
        await ws.send('{"type":"close"}')
        await _until_closed(ws)


async def run_load(kind: str, url: str, sessions: int, steps: int) -> dict[str, float]:
    start = asyncio.Event()
    lats: list[list[float]] = [[] for _ in range(sessions)]
    ready: list[int] = []
    one = _vriksha_session if kind == "vriksha" else _openenv_session
    tasks = [asyncio.create_task(one(url, steps, start, lats[i], ready)) for i in range(sessions)]
    # wait until every session is connected and reset, so the clock times steps only
    deadline = time.monotonic() + 60
    while len(ready) < sessions and time.monotonic() < deadline:
        if any(t.done() for t in tasks):
            await asyncio.gather(*tasks)  # raises the failure
        await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    flat = sorted(x for ls in lats for x in ls)
    return {
        "sessions": sessions,
        "steps": len(flat),
        "steps_per_s": len(flat) / wall,
        "p50_ms": 1e3 * statistics.median(flat),
        "p99_ms": 1e3 * flat[min(len(flat) - 1, int(0.99 * len(flat)))],
    }


def start_server(kind: str, port: int, max_sessions: int, heartbeat_s: float) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", kind, "--port", str(port)]
    cmd += ["--max-sessions", str(max_sessions), "--heartbeat-s", str(heartbeat_s)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + 240  # imports are slow on a busy machine
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {kind} server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {kind} server did not come up on port {port}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux), to report the server's CPU cost per step."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def measure(kind: str, url: str, pid: int, sessions: int, steps: int) -> dict[str, float]:
    c0 = cpu_seconds(pid)
    row = asyncio.run(run_load(kind, url, sessions, steps))
    row["server_cpu_us_per_step"] = 1e6 * (cpu_seconds(pid) - c0) / row["steps"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sessions", type=int, nargs="+", default=[1, 8, 64], help="concurrent sessions per point"
    )
    ap.add_argument("--steps", type=int, default=50, help="steps per session")
    ap.add_argument(
        "--rounds", type=int, default=5, help="rounds per point, alternating servers; best round kept"
    )
    ap.add_argument("--heartbeat-s", type=float, default=1.0, help="vriksha server heartbeat interval")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--serve", choices=["vriksha", "openenv"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--max-sessions", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve == "vriksha":
        serve_vriksha(args.port, args.max_sessions, args.heartbeat_s)
        return 0
    if args.serve == "openenv":
        serve_openenv(args.port, args.max_sessions)
        return 0

    sys.path.insert(0, ROOT)
    from vriksha.net.launch import free_port

    cap = max(args.sessions)
    kinds = ("vriksha", "openenv")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls: dict[str, str] = {}
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    try:
        for kind in kinds:
            port = free_port()
            procs[kind] = start_server(kind, port, cap, args.heartbeat_s)
            urls[kind] = f"ws://127.0.0.1:{port}"
            asyncio.run(run_load(kind, urls[kind], 1, 20))  # warm up
        for n in args.sessions:
            rounds: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
            for _ in range(args.rounds):  # alternate, so both servers see the same machine load
                for kind in kinds:
                    rounds[kind].append(measure(kind, urls[kind], procs[kind].pid, n, args.steps))
            for kind in kinds:
                best = dict(max(rounds[kind], key=lambda r: r["steps_per_s"]))
                # CPU per step varies less than wall-clock rates on a shared machine: report its median
                best["server_cpu_us_per_step"] = statistics.median(
                    r["server_cpu_us_per_step"] for r in rounds[kind]
                )
                results[kind].append(best)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)

    head = f"{'steps/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>7}"
    print(f"{'sessions':>8} | vriksha {head} | openenv-core {head} | {'ratio':>6} {'cpu ratio':>9}")
    for v, o in zip(results["vriksha"], results["openenv"], strict=True):
        ratio = v["steps_per_s"] / o["steps_per_s"]
        # a run shorter than the kernel's CPU clock tick (10 ms) can read no CPU time at all
        cpu_ratio = (
            f"{o['server_cpu_us_per_step'] / v['server_cpu_us_per_step']:>8.2f}x"
            if v["server_cpu_us_per_step"] > 0 and o["server_cpu_us_per_step"] > 0
            else f"{'-':>9}"
        )
        cells = [
            f"{r['steps_per_s']:>9,.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['server_cpu_us_per_step']:>7.0f}"
            for r in (v, o)
        ]
        print(
            f"{v['sessions']:>8} | vriksha {cells[0]} | openenv-core {cells[1]} | {ratio:>5.2f}x {cpu_ratio}"
        )
    print(
        f"steps/s: all sessions' steps over the step phase's wall time (best of {args.rounds} alternating rounds); "
        "cpu us: the server's CPU time per step (median); ratio: vriksha / openenv-core steps/s; "
        "cpu ratio: openenv-core / vriksha CPU per step"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps_per_session": args.steps, **results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
