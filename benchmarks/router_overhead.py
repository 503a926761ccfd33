"""Where `vriksha router` spends its time per request, without an engine: two stub replicas (answer at once)
behind the router app in this process, its policy state filled as after the shared-prefix workload, and a
client process that alternates one request straight to a stub with the same request through the router.
Prints the added latency p50/p99 per policy and prompt length, and with `--profile` the router's top
functions (cProfile) for one policy. On a loaded machine absolute times inflate; the ratios between parts
hold.

    python benchmarks/router_overhead.py --samples 200                        # every policy
    python benchmarks/router_overhead.py --policies precise --profile         # where precise's time goes
    python benchmarks/router_overhead.py --samples 20 --groups 2               # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router import WORDS, free_port  # noqa: E402
from router_hop import STUB  # noqa: E402
from server_load import pct  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

CLIENT = textwrap.dedent(
    """
    import sys, json, time, httpx
    direct, routed, n, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    bodies = json.load(open(path))
    out = {}
    with httpx.Client(timeout=60) as c:
        for name, body in bodies.items():
            diffs = []
            for _ in range(n):
                t0 = time.perf_counter(); c.post(direct + "/v1/completions", json=body)
                t1 = time.perf_counter(); r = c.post(routed + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
                diffs.append((time.perf_counter() - t1) - (t1 - t0))
            out[name] = diffs
    print(json.dumps(out))
    """
)


def prompts(args: argparse.Namespace) -> list[str]:
    rng = random.Random(args.seed)
    pre = [
        f"Group {g}: " + " ".join(rng.choice(WORDS) for _ in range(args.prefix_words))
        for g in range(args.groups)
    ]
    return [
        f"{pre[g]} Question {i}: {rng.choice(WORDS)}?"
        for i in range(args.per_group)
        for g in range(args.groups)
    ]


async def measure(policy: str, stubs: list[str], tokens, args, bodies_path: Path) -> dict:
    import uvicorn

    from vriksha.kv_events.token_tree import TokenTree
    from vriksha.router.app import create_router_app
    from vriksha.router.config import ReplicaSpec, RouterConfig
    from vriksha.router.subscriber import EventSubscriber

    config = RouterConfig(replicas=[ReplicaSpec(u) for u in stubs], policy=policy)
    app = create_router_app(config, tokens)
    pool = app.state.pool
    for r in pool.replicas:  # a synced mirror as the events would build it (not started: no stream here)
        r.events = EventSubscriber(r.url, "tcp://127.0.0.1:1", f"{r.url}/kv_events/snapshot", pool.http)
        r.events.tree, r.events.synced = TokenTree(), True
    for i, p in enumerate(prompts(args)):  # the state after a shared-prefix run
        ids = tokens.tokenizer.encode(p, add_special_tokens=False)
        pool.policy.routed(pool.policy.choose(ids, pool.replicas), ids)
        pool.replicas[i % len(pool.replicas)].events.tree.insert(ids)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        stubs[0],
        f"http://127.0.0.1:{port}",
        str(args.samples),
        str(bodies_path),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if prof:
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.profile_lines)
        print(s.getvalue())
    server.should_exit = True
    await task
    diffs = json.loads(out)
    return {k: (pct(v, 50) * 1000, pct(v, 99) * 1000) for k, v in diffs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="whose tokenizer (default: the embedded model)")
    ap.add_argument("--policies", nargs="+", default=["round_robin", "least_load", "cache_aware", "precise"])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--prefix-words", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile the router while it serves")
    ap.add_argument("--profile-lines", type=int, default=40)
    args = ap.parse_args()

    from vriksha.router.tokens import PromptTokens

    tokens = PromptTokens.for_model(args.model)
    ports = [free_port(), free_port()]
    stubs = [subprocess.Popen([sys.executable, "-c", STUB, str(p)]) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    bodies_path = Path(f"/tmp/vriksha-router-overhead-{ports[0]}.json")
    long_prompt = prompts(args)[0] + " again"
    base = {"model": "m", "max_tokens": 1, "temperature": 0}
    bodies_path.write_text(
        json.dumps({"short": {**base, "prompt": "Hi"}, "long": {**base, "prompt": long_prompt}})
    )
    try:
        for u in urls:
            for _ in range(100):
                try:
                    if httpx.get(f"{u}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
        print(f"{'policy':<14}{'prompt':<8}{'added p50 ms':>13}{'p99':>8}")
        for policy in args.policies:
            res = asyncio.run(measure(policy, urls, tokens, args, bodies_path))
            for k, (p50, p99) in res.items():
                print(f"{policy:<14}{k:<8}{p50:>13.2f}{p99:>8.2f}")
    finally:
        for s in stubs:
            s.terminate()
            s.wait(10)
        bodies_path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
