"""The router's own HTTP hop, side by side: one tiny request straight to an upstream against the same request
through `vriksha router` (and, with `--vllm-router`, through vllm-router), order alternating, for a
non-streaming and a streaming completion. The upstream is a stub that answers at once (`--upstream stub`,
which isolates the router's cost) or a real `vriksha serve` with the embedded model at max_tokens=1
(`--upstream serve`). Prints, per route and request kind, the latency p50/p99 direct and through the
router, the added p50/p99 and the router process's CPU time per request (the scheduler's count from /proc, the
background load polling measured while idle and subtracted): on a shared machine wall times inflate, CPU
time per request much less. `--profile` runs the router under cProfile and prints its top functions.

    python benchmarks/router_hop.py --samples 500                            # stub upstream, the idle run
    python benchmarks/router_hop.py --samples 300 --upstream serve           # a real replica, max_tokens=1
    python benchmarks/router_hop.py --samples 300 --profile                  # where the router's time goes
    python benchmarks/router_hop.py --samples 500 --compare /tmp/vriksha-prev   # against another checkout
    python benchmarks/router_hop.py --samples 20                             # a smoke run
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pstats
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]
from server_load import pct  # noqa: E402

from vriksha.net.launch import Child, free_port, stop_all, vriksha_command  # noqa: E402

STUB = textwrap.dedent(
    """
    import sys, json, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response, JSONResponse, StreamingResponse
    from starlette.routing import Route
    ANSWER = json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "text": "x", "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    CHUNK = b'data: {"id":"c","object":"text_completion","created":0,"model":"m","choices":[{"index":0,' \\
        b'"text":"x","finish_reason":null}]}\\n\\n'
    async def chunks():
        yield CHUNK
        yield CHUNK.replace(b'null', b'"length"')
        yield b"data: [DONE]\\n\\n"
    async def comp(request):
        body = json.loads(await request.body())
        if body.get("stream"):
            return StreamingResponse(chunks(), media_type="text/event-stream")
        return Response(ANSWER, media_type="application/json")
    async def load(request):
        return JSONResponse({"num_running": 0, "num_waiting": 0, "kv_usage": 0.0})
    async def health(request):
        return JSONResponse({"status": "ok"})
    app = Starlette(routes=[Route("/v1/completions", comp, methods=["POST"]), Route("/load", load),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


# the router under cProfile only while requests are measured: SIGUSR1 starts it, SIGUSR2 writes the stats
PROFILED = textwrap.dedent(
    """
    import cProfile, signal, sys
    from vriksha.cli import main
    prof, out = cProfile.Profile(), sys.argv.pop(1)
    signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
    signal.signal(signal.SIGUSR2, lambda *_: (prof.disable(), prof.dump_stats(out)))
    sys.exit(main())
    """
)


def cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has run so far, all its threads (the scheduler's nanosecond count)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            pass
    return total / 1e9


class Target:
    """A keep-alive HTTP/1.1 connection to one base URL (http.client: the same cheap client for every leg)."""

    def __init__(self, name: str, port: int, pid: int | None) -> None:
        self.name, self.port, self.pid = name, port, pid
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, body: bytes) -> float:
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        dt = time.perf_counter() - t0
        if resp.status != 200 or not data:
            raise SystemExit(f"{self.name} answered {resp.status}: {data[:300]!r}")
        return dt


def measure(direct: Target, routes: list[Target], body: bytes, n: int, warmup: int) -> dict:
    times: dict[str, list[float]] = {t.name: [] for t in [direct, *routes]}
    for t in [direct, *routes]:
        for _ in range(warmup):
            t.post(body)
    cpu0 = {t.name: cpu_s(t.pid) for t in routes if t.pid is not None}
    for i in range(n):
        for t in [direct, *routes] if i % 2 else [*routes, direct]:
            times[t.name].append(t.post(body))
    cpu = {name: cpu_s(t.pid) - c for t in routes for name, c in cpu0.items() if t.name == name}
    out = {}
    base = times[direct.name]
    for t in routes:
        diffs = [a - b for a, b in zip(times[t.name], base, strict=True)]
        out[t.name] = {
            "direct_p50_ms": pct(base, 50) * 1e3,
            "routed_p50_ms": pct(times[t.name], 50) * 1e3,
            "routed_p99_ms": pct(times[t.name], 99) * 1e3,
            "added_p50_ms": pct(diffs, 50) * 1e3,
            "added_p99_ms": pct(diffs, 99) * 1e3,
            "cpu_ms_per_request": cpu[t.name] / n * 1e3 if t.name in cpu else float("nan"),
        }
    return out


def idle_cpu_rate(pid: int, seconds: float = 2.0) -> float:
    c0 = cpu_s(pid)
    time.sleep(seconds)
    return (cpu_s(pid) - c0) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", choices=("stub", "serve"), default="stub")
    ap.add_argument(
        "--model", default=None, help="the model of `--upstream serve` and the router's tokenizer"
    )
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--vllm-router", action="store_true", help="also through vllm-router (round_robin)")
    ap.add_argument(
        "--compare",
        type=Path,
        nargs="*",
        default=[],
        metavar="DIR",
        help="also through the router of another checkout of vriksha (e.g. one of the previous commit)",
    )
    ap.add_argument("--profile", action="store_true", help="run the router under cProfile; print its top")
    ap.add_argument("--profile-lines", type=int, default=35)
    ap.add_argument("--output-json", type=Path, default=None)
    args = ap.parse_args()

    log_dir = Path(tempfile.mkdtemp(prefix="vriksha-router-hop-"))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    children: list[Child] = []
    try:
        up_port = free_port()
        up_url = f"http://127.0.0.1:{up_port}"
        if args.upstream == "stub":
            cmd = [sys.executable, "-c", STUB, str(up_port)]
        else:
            cmd = vriksha_command(
                "serve", "--port", str(up_port), *(["--model", args.model] if args.model else [])
            )
        up = Child(cmd, "upstream", f"{up_url}/health", log_path=log_dir / "upstream.log", env=env).start()
        children.append(up)
        trees = [("vriksha router", REPO)] + [(f"router@{d.name}", d.resolve()) for d in args.compare]
        prof_path = log_dir / "router.prof"
        routers: list[tuple[Target, Child]] = []
        for i, (name, tree) in enumerate(trees):
            port = free_port()
            rcmd = vriksha_command(
                "router",
                "--replica",
                up_url,
                "--policy",
                args.policy,
                "--port",
                str(port),
                log_level="WARNING",
            )
            rcmd += ["--model", args.model] if args.model else []
            if args.profile and i == 0:
                rcmd[1:3] = ["-c", PROFILED, str(prof_path)]
            renv = dict(env, PYTHONPATH=str(tree))
            # run in the tree: `python -m` puts the working directory ahead of PYTHONPATH, so run from a
            # checkout every router would import that checkout's vriksha
            health = f"http://127.0.0.1:{port}/health"
            child = Child(rcmd, name, health, log_path=log_dir / f"r{i}.log", env=renv, cwd=str(tree))
            children.append(child.start())
            routers.append((Target(name, port, None), child))
        vllm = None
        if args.vllm_router:
            exe = shutil.which("vllm-router")
            if exe is None:
                raise SystemExit("--vllm-router: no vllm-router on PATH (pip install vllm-router)")
            v_port = free_port()
            vcmd = [exe, "--worker-urls", up_url, "--policy", "round_robin", "--port", str(v_port)]
            vllm = Child(
                vcmd, "vllm-router", f"http://127.0.0.1:{v_port}/health", log_path=log_dir / "vllm.log"
            )
            children.append(vllm.start())
        for c in children:
            c.wait_healthy(600)
        for target, child in routers:
            assert child.proc is not None
            target.pid = child.proc.pid
        idle = {t.name: idle_cpu_rate(t.pid) for t, _ in routers}  # the background /load and /health polls
        direct = Target("direct", up_port, None)
        routes = [t for t, _ in routers]
        if vllm is not None:
            assert vllm.proc is not None
            routes.append(Target("vllm-router", v_port, vllm.proc.pid))
        base = {"model": "m", "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        results = {}
        if args.profile:
            os.kill(routes[0].pid, signal.SIGUSR1)
        for kind, extra in (("plain", {}), ("stream", {"stream": True})):
            t0 = time.perf_counter()
            res = measure(direct, routes, json.dumps({**base, **extra}).encode(), args.samples, args.warmup)
            took = time.perf_counter() - t0
            for name, row in res.items():
                row["cpu_ms_per_request"] -= idle.get(name, 0.0) * took / args.samples * 1e3
            results[kind] = res
        if args.profile:
            os.kill(routes[0].pid, signal.SIGUSR2)
            time.sleep(2)
        head = f"{'route':<18}{'request':<9}{'direct p50':>11}{'routed p50':>11}{'p99':>8}"
        print(head + f"{'added p50':>10}{'p99':>8}{'router CPU ms/req':>19}")
        for kind, res in results.items():
            for name, r in res.items():
                print(
                    f"{name:<18}{kind:<9}{r['direct_p50_ms']:>11.2f}{r['routed_p50_ms']:>11.2f}"
                    f"{r['routed_p99_ms']:>8.2f}{r['added_p50_ms']:>10.2f}{r['added_p99_ms']:>8.2f}"
                    f"{r['cpu_ms_per_request']:>19.3f}"
                )
        if args.output_json:
            args.output_json.write_text(json.dumps(results, indent=2))
    finally:
        stop_all(children)
    if args.profile and prof_path.exists():
        pstats.Stats(str(prof_path)).sort_stats("tottime").print_stats(args.profile_lines)
    shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
