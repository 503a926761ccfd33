"""The P/D scenario of benchmarks/router.py: long prompts mixed into a stream of short chats, on the same
cores served two ways:

- colocated: two `vriksha serve` replicas (one core and thread each) behind `vriksha router`;
- P/D: one `--role prefill` and one `--role decode` replica (the same cores) behind `vriksha router
  --prefill P --replica D`: long prompts are computed on P and their K/V moved to D, so D's decode steps
  never stall behind a long prefill.

Short chats run back to back on `--pd-chats` connections (each a fresh short prompt, streamed); long prompts
(`--pd-long-words` words, each distinct) arrive every `--pd-long-interval` seconds meanwhile. Reported: the
short chats' ITL p50/p99/max (decode smoothness), TTFT of both kinds, and total output tokens/s.

The defaults (4 chats, 8 long prompts of 600 words 1.5 s apart) make the stalls a measurable share of the
ITL samples: a colocated long prompt stalls the chats on its replica for one step per prefill chunk (512
tokens, `--chunked-prefill-size`), a couple of samples per chat. With 2 chats and 4 long prompts (the former
defaults: `--pd-chats 2 --pd-long 4 --pd-long-interval 3`) those are under 1% of the ~900 samples, so the
p99 measures the noise floor of both setups rather than the stalls (the max column shows them).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

import httpx
import router as bench  # benchmarks/router.py: replica_command(), launch(), ready(), request(), pct()

from vriksha.net.launch import Child


class Setup:
    """Two replicas (colocated, or prefill + decode) on one core each, and a router in front."""

    def __init__(self, args, log_dir: Path, disaggregated: bool) -> None:
        self.args, self.log_dir = args, log_dir
        self.procs: list[Child] = []
        kind = "pd" if disaggregated else "colocated"
        roles = ["prefill", "decode"] if disaggregated else ["both", "both"]
        router_cmd = [sys.executable, "-m", "vriksha.cli", "router", "--policy", args.pd_policy]
        urls = []
        for i, role in enumerate(roles):
            port, events = bench.free_port(), bench.free_port()
            url = f"http://127.0.0.1:{port}"
            flags = ["--role", role]
            if role == "decode":
                flags += ["--kv-peer", urls[0]]  # the prefill replica, started first
            if role != "prefill":
                flags += ["--kv-events-endpoint", f"tcp://127.0.0.1:{events}"]
                router_cmd += ["--replica", f"{url},tcp://127.0.0.1:{events}"]
            else:
                router_cmd += ["--prefill", url]
                if args.pd_threshold is not None:
                    router_cmd += ["--pd-threshold", str(args.pd_threshold)]
            cmd = bench.replica_command(args, i, port, *flags)
            self.procs.append(bench.launch(cmd, f"{kind}-{role}{i}", log_dir, url, args.threads))
            urls.append(url)
        bench.ready(self.procs, log_dir)
        self.model = httpx.get(f"{urls[-1]}/v1/models").json()["data"][0]["id"]
        port = bench.free_port()
        router_cmd += ["--port", str(port)] + (["--model", args.model] if args.model else [])
        self.url = f"http://127.0.0.1:{port}"
        self.procs.append(bench.launch(router_cmd, f"{kind}-router", log_dir, self.url))
        bench.ready(self.procs[-1:], log_dir)
        time.sleep(1.0)

    def transfers(self) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith("vriksha_router_pd_transfers_total{") and 'status="ok"' in line
        )

    def stop(self) -> None:
        bench.stop_all(self.procs, 60)


async def mixed(url: str, model: str, args) -> tuple[list, list, float]:
    """Short chats back to back on `pd_chats` connections while `pd_long` long prompts arrive spaced out."""
    rng = random.Random(args.seed + 2)
    shorts: list = []
    longs: list = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=600) as client:

        async def chatter(c: int) -> None:
            n = 0
            while not stop.is_set() and n < args.pd_max_short:
                prompt = f"Chat {c}.{n}: {bench.words(rng, 6)}?"
                shorts.append(await bench.request(client, url, model, prompt, args))
                n += 1

        async def long_prompts() -> None:
            for i in range(args.pd_long):
                await asyncio.sleep(args.pd_long_interval)
                prompt = (
                    f"Document {i} ({rng.random():.6f}): {bench.words(rng, args.pd_long_words)}\nSummary:"
                )
                longs.append(await bench.request(client, url, model, prompt, args))

        t0 = time.perf_counter()
        chats = [asyncio.create_task(chatter(c)) for c in range(args.pd_chats)]
        await long_prompts()
        stop.set()
        await asyncio.gather(*chats)
        return shorts, longs, time.perf_counter() - t0


async def warm_up(url: str, model: str, args) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        await bench.request(client, url, model, "warm up", args)


STALL_MS = 250.0  # an ITL sample this long is a stall: a step that carried a prefill chunk, not a decode step


def summarize(shorts: list, longs: list, duration: float, transfers: float) -> dict:
    ok = [r for r in shorts + longs if r.ok]
    itl = [x for r in shorts if r.ok for x in r.itl]
    ms = 1000.0
    stalled = sum(x * ms >= STALL_MS for x in itl)
    return {
        "short": len([r for r in shorts if r.ok]),
        "long": len([r for r in longs if r.ok]),
        "failed": len(shorts) + len(longs) - len(ok),
        "short_itl_p50_ms": bench.pct(itl, 50) * ms,
        "short_itl_p95_ms": bench.pct(itl, 95) * ms,
        "short_itl_p99_ms": bench.pct(itl, 99) * ms,
        "short_itl_max_ms": max(itl, default=float("nan")) * ms,
        "itl_samples": len(itl),
        "short_itl_stalled": stalled,  # what the p99 sees only when it exceeds 1% of the samples
        "short_itl_stalled_pct": 100.0 * stalled / len(itl) if itl else 0.0,
        "short_ttft_p50_ms": bench.pct([r.ttft for r in shorts if r.ok], 50) * ms,
        "long_ttft_p50_ms": bench.pct([r.ttft for r in longs if r.ok], 50) * ms,
        "out_tok_per_s": sum(r.output_tokens for r in ok) / duration if duration else 0.0,
        "duration_s": duration,
        "transfers": transfers,
    }


def run_pd(args, log_dir: Path) -> dict:
    """`--pd-runs` rounds of (colocated, P/D), alternating so that a drift of the machine's speed falls on
    both; the summary pools every round's samples (the p99 of one short round rests on a few dozen of them)."""
    per_run: list[dict] = []
    pooled: dict[str, tuple[list, list, float, float]] = {}
    for _ in range(args.pd_runs):
        row = {}
        for kind, disaggregated in (("colocated", False), ("pd", True)):
            setup = Setup(args, log_dir, disaggregated)
            try:
                asyncio.run(warm_up(setup.url, setup.model, args))
                shorts, longs, duration = asyncio.run(mixed(setup.url, setup.model, args))
                moved = setup.transfers() if disaggregated else 0.0
            finally:
                setup.stop()
            row[kind] = summarize(shorts, longs, duration, moved)
            s, lg, d, m = pooled.get(kind, ([], [], 0.0, 0.0))
            pooled[kind] = (s + shorts, lg + longs, d + duration, m + moved)
        per_run.append(row)
    rows: dict = {kind: summarize(*p) for kind, p in pooled.items()}
    rows["runs"] = per_run
    return rows


def _line(kind: str, s: dict) -> str:
    return (
        f"{kind:<11}{s['short']:>6}{s['long']:>5}{s['short_itl_p50_ms']:>9.1f}{s['short_itl_p95_ms']:>8.1f}"
        f"{s['short_itl_p99_ms']:>8.1f}{s['short_itl_max_ms']:>8.1f}"
        f"{s['short_ttft_p50_ms']:>11.1f}{s['long_ttft_p50_ms']:>8.1f}{s['out_tok_per_s']:>8.1f}"
        f"{s['transfers']:>6.0f}{s['short_itl_stalled']:>8}{s['short_itl_stalled_pct']:>7.2f}%"
        + (f"  failed {s['failed']}" if s["failed"] else "")
    )


def _ratios(c: dict, p: dict) -> tuple[float, float]:
    better = c["short_itl_p99_ms"] / p["short_itl_p99_ms"] if p["short_itl_p99_ms"] else 0.0
    ratio = p["out_tok_per_s"] / c["out_tok_per_s"] if c["out_tok_per_s"] else 0.0
    return better, ratio


def report_pd(rows: dict) -> str:
    head = f"{'serving':<11}{'short':>6}{'long':>5}{'ITL p50':>9}{'p95':>8}{'p99':>8}{'max':>8}{'TTFT short':>11}"
    head += f"{'long':>8}{'tok/s':>8}{'moved':>6}{'stalls':>8}{'share':>8}"
    runs = rows.get("runs", [])
    lines = [
        "P/D: long prompts mixed into short chats (1 prefill + 1 decode vs 2 colocated, same cores)"
        + (f", {len(runs)} rounds pooled" if len(runs) > 1 else "")
        + f"; stalls: ITL samples of {STALL_MS:.0f} ms or more, and their share of all",
        head,
    ]
    lines += [_line(kind, rows[kind]) for kind in ("colocated", "pd") if kind in rows]
    if len(runs) > 1:
        for i, run in enumerate(runs):
            better, ratio = _ratios(run["colocated"], run["pd"])
            lines.append(
                f"  round {i + 1}: ITL p99 {better:.2f}x better, throughput {ratio:.0%} of colocated"
            )
    if "colocated" in rows and "pd" in rows:
        better, ratio = _ratios(rows["colocated"], rows["pd"])
        lines.append(f"{'MET ' if better >= 2 else 'MISS'}  P/D decode ITL p99 >= 2x better ({better:.2f}x)")
        lines.append(
            f"{'MET ' if ratio >= 0.8 else 'MISS'}  P/D throughput within 20% ({ratio:.0%} of colocated)"
        )
    return "\n".join(lines)


def add_arguments(ap) -> None:
    g = ap.add_argument_group("P/D scenario (--pd)")
    g.add_argument("--pd", action="store_true", help="also run the prefill/decode scenario")
    g.add_argument("--pd-only", action="store_true", help="run only the prefill/decode scenario")
    g.add_argument("--pd-chats", type=int, default=4, help="short chats running back to back")
    g.add_argument("--pd-long", type=int, default=8, help="long prompts mixed in")
    g.add_argument("--pd-long-words", type=int, default=600, help="words of each long prompt")
    g.add_argument("--pd-long-interval", type=float, default=1.5, help="seconds between long prompts")
    g.add_argument("--pd-max-short", type=int, default=1000, help="bound on each chat's requests")
    g.add_argument(
        "--pd-threshold",
        type=int,
        default=None,
        help="the router's --pd-threshold (default: the router's own)",
    )
    g.add_argument("--pd-runs", type=int, default=1, help="rounds of both setups, pooled in the summary")
    g.add_argument("--pd-policy", default="precise", help="the router's --policy for both setups")
