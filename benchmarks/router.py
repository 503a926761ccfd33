"""Routers over vriksha replicas, side by side: 2 replicas (1 thread each, pinned to a core each where
`taskset` exists) behind `vriksha router` with each of its policies and behind vllm-router's cache_aware and
kv_aware, on two workloads:

- shared-prefix: groups of requests with a long common prefix, the groups arriving interleaved;
- multi-turn: conversations whose next turn extends the last (prompt + answer + a new user line).

Per policy and workload: prefix-cache hit rate (cached / prompt tokens, as the replicas report them) beside
the rate one shared cache would reach, throughput, TTFT and ITL p50/p99, the CPU seconds the router process
used (it shares the machine's cores with the replicas) and how many requests each replica served (where the
router names it); per router the latency it adds (a one-token request through it against the same request
sent straight to the replica that served it). Loopback only.

The default sizes are the regime where routing matters: each replica's KV pool holds 2560 tokens
(`--kv-tokens`, passed as `vriksha serve --kv-cache-tokens`), the 13 groups' prefixes (300 words, about
310 tokens each: about 4000 tokens) and the 12 conversations (about 270 tokens each at their last turn) do
not fit in one pool but do in two. The group count is odd so that round robin, taking the interleaved
arrivals in turn, sends every group to both replicas (with an even count over 2 replicas it would send group
g to replica g mod 2, as a prefix-aware policy would); their LRU caches then cycle through all 13 prefixes
and keep few; a prefix-aware policy keeps about half the groups on each.
"One shared cache" is one replica whose pool is the two pools together. With `--kv-tokens 0 --groups 4
--per-group 8 --conversations 4` (the engine's default pool, 1 GiB on the CPU: every prefix fits
everywhere) round robin already reaches the ideal hit rate on shared prefixes.

    python benchmarks/router.py                                     # the embedded model, default sizes
    python benchmarks/router.py --model /tmp/tiny --groups 2 --per-group 2 --prefix-words 40 \
        --conversations 2 --turns 2 --max-tokens 4 --overhead-samples 5 --kv-tokens 200   # a smoke run

With `--pd` (or `--pd-only`) also the prefill/decode scenario (benchmarks/router_pd.py): long prompts mixed
into short chats, 1 prefill + 1 decode replica against 2 colocated ones on the same cores:

    python benchmarks/router.py --pd-only                                        # on an idle machine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]
from server_load import pct  # noqa: E402

from vriksha.net.launch import Child, StartupError, free_port, stop_all  # noqa: E402
from vriksha.net.trust import INTERNAL_KEY_ENV, env_key, new_key  # noqa: E402

POLICIES = ("round_robin", "least_load", "cache_aware", "precise", "vllm:cache_aware", "vllm:kv_aware")
WORDS = "river stone field light harvest market winter bridge lantern forest signal garden copper".split()


def replica_command(args: argparse.Namespace, index: int, port: int, *flags: str) -> list[str]:
    """`vriksha serve --port PORT FLAGS` over `args.model`, pinned to the `index`-th `args.threads` cores where
    `taskset` exists."""
    cmd = [sys.executable, "-m", "vriksha.cli", "serve", "--port", str(port), *flags]
    cmd += ["--model", args.model] if args.model else []
    if shutil.which("taskset"):
        ncpu = os.cpu_count() or 1
        cores = range(index * args.threads, (index + 1) * args.threads)
        cmd = ["taskset", "-c", ",".join(str(c % ncpu) for c in cores), *cmd]
    return cmd


INTERNAL_KEY = env_key(INTERNAL_KEY_ENV) or new_key()


def launch(cmd: list[str], name: str, log_dir: Path, url: str, threads: int | None = None) -> Child:
    """`cmd` started with this checkout first on PYTHONPATH, its output in `log_dir/NAME.log`."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env[INTERNAL_KEY_ENV] = (
        INTERNAL_KEY  # the replicas' and routers' shared key (event streams, snapshots, P/D)
    )
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return Child(cmd, name, f"{url}/health", log_path=log_dir / f"{name}.log", env=env, cwd=str(REPO)).start()


def ready(children: list[Child], log_dir: Path, timeout_s: float = 600.0) -> None:
    """Wait until each child answers /health; the benchmark stops with the reason if one does not."""
    for c in children:
        try:
            c.wait_healthy(timeout_s, hint=f"; see {log_dir}")
        except StartupError as exc:
            raise SystemExit(str(exc)) from None


@dataclass(slots=True)
class Result:
    ok: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""
    error: str = ""
    replica: str = ""  # the replica that served it, where the router names it (x-vriksha-replica)


def kv_bound(tokens: int) -> list[str]:
    """`vriksha serve` flags that size its KV pool to `tokens`, whatever its KV dtype (none for 0: the engine's
    default)."""
    return ["--kv-cache-tokens", str(tokens)] if tokens > 0 else []


class Fleet:
    """The replicas and whichever router is running in front of them."""

    def __init__(self, args: argparse.Namespace, log_dir: Path) -> None:
        self.args, self.log_dir = args, log_dir
        self.procs: list[Child] = []
        self.replicas: list[dict] = []
        for i in range(args.replicas):
            r = {"port": free_port(), "events": free_port(), "vllm": free_port()}
            r["url"] = f"http://127.0.0.1:{r['port']}"
            cmd = replica_command(
                args,
                i,
                r["port"],
                "--kv-events-endpoint",
                f"tcp://127.0.0.1:{r['events']}",
                "--kv-events-vllm-endpoint",
                f"tcp://127.0.0.1:{r['vllm']}",
                *kv_bound(args.kv_tokens),
            )
            self.replicas.append(r)
            self.procs.append(launch(cmd, f"replica{i}", log_dir, r["url"], args.threads))
        ready(self.procs, log_dir)
        self.model = httpx.get(f"{self.replicas[0]['url']}/v1/models").json()["data"][0]["id"]
        self.router: Child | None = None

    def start_router(self, policy: str) -> str:
        port = free_port()
        if policy.startswith("vllm:"):
            binary = shutil.which("vllm-router")
            if binary is None:
                raise FileNotFoundError("vllm-router is not installed (pip install vllm-router)")
            cmd = [binary, "--port", str(port), "--prometheus-port", str(free_port()), "--policy", policy[5:]]
            cmd += ["--worker-urls", *(r["url"] for r in self.replicas)]
            if policy == "vllm:kv_aware":
                for r in self.replicas:
                    cmd += ["--kv-event-source", f"{r['url']}=tcp://127.0.0.1:{r['vllm']}"]
                model_dir = self._model_dir()
                cmd += ["--kv-event-block-size", "16", "--kv-event-model", model_dir]
        else:
            cmd = [sys.executable, "-m", "vriksha.cli", "router", "--port", str(port), "--policy", policy]
            cmd += ["--model", self.args.model] if self.args.model else []
            for r in self.replicas:
                cmd += ["--replica", f"{r['url']},tcp://127.0.0.1:{r['events']}"]
        self.router = launch(cmd, policy.replace(":", "-"), self.log_dir, f"http://127.0.0.1:{port}")
        ready([self.router], self.log_dir)
        time.sleep(1.0)  # event subscriptions connect, first load polls land
        return f"http://127.0.0.1:{port}"

    def _model_dir(self) -> str:
        from vriksha.loading.loader import resolve_model_path

        return str(resolve_model_path(self.args.model))

    def stop_router(self) -> None:
        if self.router is not None:
            self.router.stop(60)  # a busy machine: it has had its chance to drain
            self.router = None

    def flush(self) -> None:
        for r in self.replicas:
            httpx.post(f"{r['url']}/flush_cache", timeout=30)

    def stop(self) -> None:
        self.stop_router()
        stop_all(self.procs, 60)


async def request(client: httpx.AsyncClient, url: str, model: str, prompt: str, args) -> Result:
    body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}, "ignore_eos": True}
    res, t0 = Result(), time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            res.replica = r.headers.get("x-vriksha-replica", "")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    return res
                now = time.perf_counter()
                if chunk.get("choices") and chunk["choices"][0]["text"]:
                    res.text += chunk["choices"][0]["text"]
                    if res.ttft == 0.0:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    u = chunk["usage"]
                    res.prompt_tokens, res.output_tokens = u["prompt_tokens"], u["completion_tokens"]
                    res.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        res.e2e, res.ok = time.perf_counter() - t0, res.output_tokens > 0
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def shared_prefix(url: str, model: str, args) -> list[Result]:
    rng = random.Random(args.seed)
    prefixes = [f"Group {g}: " + words(rng, args.prefix_words) for g in range(args.groups)]
    prompts = [
        f"{prefixes[g]} Question {i}: {words(rng, 8)}?"
        for i in range(args.per_group)
        for g in range(args.groups)
    ]
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(p: str) -> Result:
            async with sem:
                return await request(client, url, model, p, args)

        return list(await asyncio.gather(*(one(p) for p in prompts)))


async def multi_turn(url: str, model: str, args) -> list[Result]:
    rng = random.Random(args.seed + 1)
    out: list[Result] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def conversation(c: int) -> None:
            history = f"Conversation {c}. System: be brief. " + words(rng, args.prefix_words // 2)
            for _ in range(args.turns):
                history += f"\nUser: {words(rng, 10)}\nAssistant:"
                res = await request(client, url, model, history, args)
                out.append(res)
                history += res.text

        await asyncio.gather(*(conversation(c) for c in range(args.conversations)))
    return out


def cpu_seconds(child: Child | None) -> float:
    """User + system CPU time the child's process has used so far (0 where /proc cannot tell)."""
    try:
        fields = Path(f"/proc/{child.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (AttributeError, OSError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    served: dict[str, int] = {}
    for r in ok:
        if r.replica:
            served[r.replica] = served.get(r.replica, 0) + 1
    prompt = sum(r.prompt_tokens for r in ok)
    itl = [x for r in ok for x in r.itl]
    ms = 1000.0
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        "req_per_s": len(ok) / duration,
        "out_tok_per_s": sum(r.output_tokens for r in ok) / duration,
        "ttft_p50_ms": pct([r.ttft for r in ok], 50) * ms,
        "ttft_p99_ms": pct([r.ttft for r in ok], 99) * ms,
        "itl_p50_ms": pct(itl, 50) * ms,
        "itl_p99_ms": pct(itl, 99) * ms,
        "served": dict(sorted(served.items())),
    }


def overhead(router_url: str, replica_urls: list[str], model: str, n: int) -> dict:
    """A one-token request through the router against the same request straight to the replica that served
    it (named in the router's x-vriksha-replica header; else the mean of one direct request to each replica),
    their order alternating so neither always runs second: the difference of their latencies."""
    body = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    diffs = []
    with httpx.Client(timeout=60) as c:

        def timed(url: str) -> tuple[float, httpx.Response]:
            t0 = time.perf_counter()
            resp = c.post(f"{url}/v1/completions", json=body)
            return time.perf_counter() - t0, resp

        for i in range(n):
            direct = {}
            if i % 2:
                direct = {u: timed(u)[0] for u in replica_urls}
            routed, resp = timed(router_url)
            if not direct:
                direct = {u: timed(u)[0] for u in replica_urls}
            served = resp.headers.get("x-vriksha-replica")
            base = direct[served] if served in direct else sum(direct.values()) / len(direct)
            diffs.append(routed - base)
    return {"added_p50_ms": pct(diffs, 50) * 1000, "added_p99_ms": pct(diffs, 99) * 1000}


WORKLOADS = {"shared-prefix": shared_prefix, "multi-turn": multi_turn}


def ideal(args: argparse.Namespace, log_dir: Path) -> dict:
    """The hit rate of one shared cache as large as the fleet's together: the whole workload on one replica
    whose KV pool is the sum of theirs."""
    one = argparse.Namespace(**{**vars(args), "replicas": 1, "kv_tokens": args.kv_tokens * args.replicas})
    fleet = Fleet(one, log_dir)
    try:
        out = {}
        for name, fn in WORKLOADS.items():
            fleet.flush()
            out[name] = summary(asyncio.run(fn(fleet.replicas[0]["url"], fleet.model, args)), 1.0)["hit_rate"]
        return out
    finally:
        fleet.stop()


def run(args: argparse.Namespace, log_dir: Path) -> dict:
    """Every policy on both workloads, `args.rounds` times, the policies' order rotated each round so that a
    drift of the machine's speed falls on all of them; a policy's row pools its rounds (requests per second
    over their summed durations), and each round's own figures are kept for the paired ratios."""
    rows: dict = {"ideal": ideal(args, log_dir), "policies": {}, "rounds": []}
    fleet = Fleet(args, log_dir)
    rows["kv_tokens"] = [
        httpx.get(f"{r['url']}/load", timeout=10).json().get("kv_total_tokens") for r in fleet.replicas
    ]
    pooled: dict[str, dict[str, tuple[list[Result], float, float]]] = {}
    overheads: dict[str, dict] = {}
    try:
        for k in range(args.rounds):
            order = args.policies[k % len(args.policies) :] + args.policies[: k % len(args.policies)]
            this_round: dict = {}
            for policy in order:
                try:
                    url = fleet.start_router(policy)
                except FileNotFoundError as exc:
                    print(f"skipping {policy}: {exc}", file=sys.stderr)
                    continue
                row: dict = {}
                try:
                    for name, fn in WORKLOADS.items():
                        fleet.flush()
                        t0, cpu0 = time.perf_counter(), cpu_seconds(fleet.router)
                        results = asyncio.run(fn(url, fleet.model, args))
                        duration, cpu = time.perf_counter() - t0, cpu_seconds(fleet.router) - cpu0
                        row[name] = summary(results, duration) | {"router_cpu_s": cpu}
                        if name == "shared-prefix":
                            row[name]["groups"] = groups_per_replica(results, args.groups)
                        res, d, c = pooled.setdefault(policy, {}).get(name, ([], 0.0, 0.0))
                        pooled[policy][name] = (res + results, d + duration, c + cpu)
                    if policy not in overheads:
                        overheads[policy] = overhead(
                            url, [r["url"] for r in fleet.replicas], fleet.model, args.overhead_samples
                        )
                finally:
                    fleet.stop_router()
                this_round[policy] = row
            rows["rounds"].append(this_round)
    finally:
        fleet.stop()
    for policy in args.policies:
        if policy in pooled:
            row = {
                name: summary(res, d) | {"router_cpu_s": c} for name, (res, d, c) in pooled[policy].items()
            }
            rows["policies"][policy] = row | {"overhead": overheads[policy]}
    return rows


def groups_per_replica(results: list[Result], groups: int) -> dict[str, list[int]]:
    """Which prefix groups each replica served (the i-th request is group i mod `groups`), where the router
    names the replica; a group split over both shows up twice."""
    out: dict[str, set[int]] = {}
    for i, r in enumerate(results):
        if r.replica:
            out.setdefault(r.replica, set()).add(i % groups)
    return {k: sorted(v) for k, v in sorted(out.items())}


def paired_ratios(rows: dict, policy: str, peer: str, workload: str) -> list[float]:
    """`policy`'s requests per second over `peer`'s, round by round."""
    return [
        r[policy][workload]["req_per_s"] / r[peer][workload]["req_per_s"]
        for r in rows.get("rounds", [])
        if policy in r and peer in r and r[peer][workload]["req_per_s"]
    ]


def report(rows: dict) -> str:
    lines = [f"KV pool per replica: {rows.get('kv_tokens')} tokens; ideal: one cache of their sum"]
    head = f"{'policy':<18}{'workload':<15}{'hit':>7}{'ideal':>7}{'req/s':>8}{'tok/s':>8}"
    head += (
        f"{'TTFT p50':>10}{'p99':>8}{'ITL p50':>9}{'p99':>8}{'added p50':>11}{'p99':>7}{'CPU s':>7}  split"
    )
    lines.append(head)
    for policy, row in rows["policies"].items():
        for name in WORKLOADS:
            s = row[name]
            o = row["overhead"]
            lines.append(
                f"{policy:<18}{name:<15}{s['hit_rate']:>7.1%}{rows['ideal'][name]:>7.1%}{s['req_per_s']:>8.2f}"
                f"{s['out_tok_per_s']:>8.1f}{s['ttft_p50_ms']:>10.1f}{s['ttft_p99_ms']:>8.1f}{s['itl_p50_ms']:>9.1f}"
                f"{s['itl_p99_ms']:>8.1f}{o['added_p50_ms']:>11.2f}{o['added_p99_ms']:>7.2f}"
                f"{s.get('router_cpu_s', 0.0):>7.2f}  {'/'.join(map(str, s.get('served', {}).values())) or '-'}"
                + (f"  failed {s['failed']}: {s['errors']}" if s["failed"] else "")
            )
    if len(rows.get("rounds", [])) > 1:
        lines += [
            "",
            f"{len(rows['rounds'])} rounds pooled; precise's req/s over each peer's, round by round:",
        ]
        for peer in rows["policies"]:
            for name in WORKLOADS:
                ratios = paired_ratios(rows, "precise", peer, name)
                if peer != "precise" and ratios:
                    mean = statistics.fmean(ratios)
                    sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
                    each = " ".join(f"{x:.2f}" for x in ratios)
                    lines.append(f"  vs {peer:<17}{name:<15}{each}  (mean {mean:.2f}x ± {sd:.2f})")
    lines += ["", *targets(rows)]
    return "\n".join(lines)


def targets(rows: dict) -> list[str]:
    p, out = rows["policies"], []
    if "precise" not in p:
        return out
    for name in WORKLOADS:
        hit = p["precise"][name]["hit_rate"]
        checks = [
            (
                f"precise >= 95% of one shared cache ({rows['ideal'][name]:.1%})",
                hit >= 0.95 * rows["ideal"][name],
            )
        ]
        if "round_robin" in p:
            checks.append(("precise >= 2x round_robin", hit >= 2 * p["round_robin"][name]["hit_rate"]))
        for peer in ("vllm:cache_aware", "vllm:kv_aware"):
            if peer in p:
                checks.append((f"precise hit >= {peer}", hit >= p[peer][name]["hit_rate"]))
                checks.append(
                    (
                        f"precise req/s >= {peer}",
                        p["precise"][name]["req_per_s"] >= p[peer][name]["req_per_s"],
                    )
                )
        out += [f"{'MET ' if ok else 'MISS'}  {name}: {what}" for what, ok in checks]
    added = p["precise"]["overhead"]["added_p50_ms"]
    out.append(f"{'MET ' if added < 2.0 else 'MISS'}  router adds < 2 ms p50 ({added:.2f} ms)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="the replicas' model (default: the embedded one)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads (and pinned cores) per replica")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=2560,
        help="each replica's KV pool in tokens (vriksha serve --kv-cache-tokens); 0: the engine's default, "
        "which holds every prefix of the default sizes",
    )
    ap.add_argument("--groups", type=int, default=13, help="prefix groups (odd: see above)")
    ap.add_argument("--per-group", type=int, default=6)
    ap.add_argument("--prefix-words", type=int, default=300, help="words of each group's shared prefix")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="times each policy runs (order rotated per round); rows pool them",
    )
    ap.add_argument("--overhead-samples", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-json", type=Path, default=None)
    ap.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "vriksha-bench-router")
    from router_pd import add_arguments, report_pd, run_pd

    add_arguments(ap)
    args = ap.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    rows: dict = {}
    if not args.pd_only:
        rows = run(args, args.log_dir)
        print(report(rows))
    if args.pd or args.pd_only:
        rows["pd"] = run_pd(args, args.log_dir)
        print(report_pd(rows["pd"]))
    if args.output_json:
        args.output_json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
