"""Serving benchmark in the shape of SGLang's bench_serving: streaming clients against `vriksha serve` on loopback.

A concurrency level (or a Poisson request rate), a workload (random token ids, or groups sharing a long prefix),
and a bound in requests and seconds. Reports throughput, TTFT, TPOT, inter-token latency (p50/p99), the prefix
cache hit rate, the engine's step durations (from the server's `vriksha_engine_step_seconds` histogram: mean
decode and prefill step, and the bucket bound under which 99% of decode steps fell) and the server's peak
resident memory, as a table and as JSON.

    python benchmarks/server_load.py --launch --concurrency 1 4 16 --num-prompts 32 --output-json bench.json
    python benchmarks/server_load.py --base-url http://127.0.0.1:8000 --workload shared-prefix --request-rate 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx
from prometheus_client.parser import text_string_to_metric_families

from vriksha.engine.core.stats import StepTimes
from vriksha.net.launch import free_port

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(slots=True)
class Result:
    ok: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def workload(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(args.token_low, args.token_high) for _ in range(n)]

    if args.workload == "random":
        return [toks(args.input_len) for _ in range(args.num_prompts)]
    prefixes = [toks(args.prefix_len) for _ in range(args.num_groups)]
    return [prefixes[i % args.num_groups] + toks(args.input_len) for i in range(args.num_prompts)]


async def one_request(
    client: httpx.AsyncClient, model: str, prompt: list[int], args: argparse.Namespace
) -> Result:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    res = Result(ok=False)
    last = t0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    return res
                now = time.perf_counter()
                if chunk.get("choices") and (
                    chunk["choices"][0]["text"] or chunk["choices"][0]["finish_reason"]
                ):
                    if res.ttft == 0.0:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    u = chunk["usage"]
                    res.prompt_tokens = u["prompt_tokens"]
                    res.output_tokens = u["completion_tokens"]
                    res.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        res.e2e = time.perf_counter() - t0
        res.ok = res.output_tokens > 0
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_level(
    base_url: str, model: str, prompts: list[list[int]], args: argparse.Namespace, concurrency: int | None
) -> tuple[list[Result], float]:
    limits = httpx.Limits(max_connections=(concurrency or len(prompts)) + 4)
    sem = asyncio.Semaphore(concurrency or len(prompts))
    rng = random.Random(args.seed + 1)
    deadline = time.perf_counter() + args.max_duration

    async with httpx.AsyncClient(
        base_url=base_url,
        timeout=args.request_timeout,
        limits=limits,
        headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
    ) as c:

        async def guarded(p: list[int]) -> Result:
            async with sem:
                if time.perf_counter() > deadline:
                    return Result(ok=False, error="skipped: --max-duration reached")
                return await one_request(c, model, p, args)

        t0 = time.perf_counter()
        tasks = []
        for p in prompts:
            tasks.append(asyncio.create_task(guarded(p)))
            if args.request_rate and args.request_rate > 0:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(results: list[Result], duration: float, concurrency: int | None, rate: float | None) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    ttft = [r.ttft for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    out = sum(r.output_tokens for r in ok)
    ms = 1000.0
    return {
        "concurrency": concurrency,
        "request_rate": rate,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": out / duration,
        "total_token_throughput": (prompt + out) / duration,
        "prompt_tokens": prompt,
        "output_tokens": out,
        "ttft_ms_mean": statistics.fmean(ttft) * ms if ttft else float("nan"),
        "ttft_ms_p50": pct(ttft, 50) * ms,
        "ttft_ms_p99": pct(ttft, 99) * ms,
        "tpot_ms_p50": pct(tpot, 50) * ms,
        "tpot_ms_p99": pct(tpot, 99) * ms,
        "itl_ms_p50": pct(itl, 50) * ms,
        "itl_ms_p99": pct(itl, 99) * ms,
        "e2e_ms_p50": pct([r.e2e for r in ok], 50) * ms,
        "cache_hit_rate": (sum(r.cached_tokens for r in ok) / prompt) if prompt else 0.0,
    }


def engine_steps(base_url: str, headers: dict[str, str]) -> StepTimes | None:
    """The server's step-duration histogram so far (None where its /metrics has none)."""
    try:
        text = httpx.get(base_url + "/metrics", headers=headers, timeout=30).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name != "vriksha_engine_step_seconds":
            continue
        times, cumulative = StepTimes(), {}
        for sample in family.samples:
            kind = sample.labels.get("kind")
            if kind not in times.counts:
                continue
            if sample.name.endswith("_bucket"):
                cumulative.setdefault(kind, []).append((float(sample.labels["le"]), int(sample.value)))
            elif sample.name.endswith("_sum"):
                times.sums[kind] = sample.value
        for kind, pairs in cumulative.items():
            counts = [c for _, c in sorted(pairs)]
            times.counts[kind] = [c - p for c, p in zip(counts, [0, *counts[:-1]], strict=True)]
        return times
    return None


def step_columns(steps: StepTimes | None) -> dict:
    ms = 1000.0
    if steps is None:
        return dict.fromkeys(
            ("decode_steps", "decode_step_ms_mean", "decode_step_ms_p99_le", "prefill_step_ms_mean")
        )
    mean_decode, mean_prefill, p99 = (
        steps.mean("decode"),
        steps.mean("prefill"),
        steps.quantile("decode", 0.99),
    )
    return {
        "decode_steps": steps.count("decode"),
        "decode_step_ms_mean": mean_decode * ms if mean_decode is not None else None,
        "decode_step_ms_p99_le": p99 * ms if p99 is not None else None,
        "prefill_step_ms_mean": mean_prefill * ms if mean_prefill is not None else None,
    }


def table(rows: list[dict], peak_rss: float | None) -> str:
    cols = [
        ("concurrency", "conc", "{}"),
        ("request_rate", "rate", "{}"),
        ("completed", "done", "{}"),
        ("failed", "fail", "{}"),
        ("request_throughput", "req/s", "{:.2f}"),
        ("output_throughput", "out tok/s", "{:.1f}"),
        ("ttft_ms_p50", "TTFT p50 ms", "{:.1f}"),
        ("ttft_ms_p99", "TTFT p99 ms", "{:.1f}"),
        ("tpot_ms_p50", "TPOT p50 ms", "{:.1f}"),
        ("tpot_ms_p99", "TPOT p99 ms", "{:.1f}"),
        ("itl_ms_p50", "ITL p50 ms", "{:.1f}"),
        ("itl_ms_p99", "ITL p99 ms", "{:.1f}"),
        ("cache_hit_rate", "cache hit", "{:.1%}"),
        ("decode_step_ms_mean", "decode step ms", "{:.1f}"),
        ("decode_step_ms_p99_le", "decode step p99 <= ms", "{:g}"),
        ("prefill_step_ms_mean", "prefill step ms", "{:.1f}"),
    ]
    head = "| " + " | ".join(h for _, h, _ in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append(
            "| " + " | ".join(f.format(r[k]) if r.get(k) is not None else "-" for k, _, f in cols) + " |"
        )
    if peak_rss is not None:
        lines.append(f"\nserver peak resident memory: {peak_rss / 2**30:.2f} GiB")
    return "\n".join(lines)


def launch(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vriksha.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-waiting",
        "100000",
        *(["--model", args.model] if args.model else []),
        *args.server_args,
    ]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(args.server_log, "wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}; see {args.server_log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("server did not become healthy in 600 s")


def peak_rss_bytes(base_url: str, api_key: str | None, proc: subprocess.Popen | None) -> float | None:
    if proc is not None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024
        except OSError:
            pass
    try:
        text = httpx.get(
            base_url + "/metrics", headers={"Authorization": f"Bearer {api_key}"} if api_key else {}
        ).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("vriksha_process_peak_rss_bytes "):
            return float(line.split()[1])
    return None


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", default=None, help="a running server on loopback (default: --launch one)")
    p.add_argument(
        "--launch", action="store_true", help="start `vriksha serve` on a free loopback port for the run"
    )
    p.add_argument(
        "--model", default=None, help="with --launch: model to serve (default: the embedded default)"
    )
    p.add_argument(
        "--server-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="with --launch: extra `vriksha serve` args (last)",
    )
    p.add_argument("--server-log", default="server_load.server.log", help="with --launch: server log file")
    p.add_argument("--api-key", default=os.environ.get("VRIKSHA_API_KEY"))
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        help="levels to run in turn (default: 1 4 16)",
    )
    p.add_argument(
        "--request-rate", type=float, default=None, help="Poisson arrivals per second instead of closed loop"
    )
    p.add_argument("--num-prompts", type=int, default=32, help="requests per level (default: 32)")
    p.add_argument(
        "--max-duration", type=float, default=300.0, help="per level: no request starts after this (s)"
    )
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--workload", choices=["random", "shared-prefix"], default="random")
    p.add_argument("--input-len", type=int, default=128, help="random tokens per prompt (after the prefix)")
    p.add_argument("--output-len", type=int, default=64, help="tokens generated per request (eos ignored)")
    p.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: tokens in each group's prefix")
    p.add_argument("--num-groups", type=int, default=4, help="shared-prefix: distinct prefixes")
    p.add_argument("--token-low", type=int, default=100)
    p.add_argument("--token-high", type=int, default=10000)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=2, help="requests sent before measuring (default: 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None, help="write the results here")
    args = p.parse_args()
    if args.num_prompts < 1 or args.num_prompts > 100_000:
        sys.exit("--num-prompts must be in 1..100000")

    proc = None
    if args.base_url is None:
        proc, base_url = launch(args)
    else:
        base_url = args.base_url.rstrip("/")
        if urlparse(base_url).hostname not in LOOPBACK:
            sys.exit(
                f"--base-url must be a loopback address ({sorted(LOOPBACK)}); this load generator targets only this machine"
            )
    try:
        h = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(base_url + "/v1/models", headers=h, timeout=30).json()["data"][0]["id"]
        prompts = workload(args)
        if args.warmup:
            warm_args = argparse.Namespace(
                **{**vars(args), "seed": args.seed + 99, "num_prompts": args.warmup}
            )
            asyncio.run(run_level(base_url, model, workload(warm_args), args, 1))
        rows = []
        levels = [None] if args.request_rate else args.concurrency
        for conc in levels:
            # each level starts from an empty prefix cache, so hits are the workload's own sharing
            httpx.post(base_url + "/flush_cache", headers=h, timeout=60)
            before = engine_steps(base_url, h)
            results, duration = asyncio.run(run_level(base_url, model, prompts, args, conc))
            after = engine_steps(base_url, h)
            steps = after.since(before) if before is not None and after is not None else None
            rows.append({**summarize(results, duration, conc, args.request_rate), **step_columns(steps)})
            print(
                f"level {conc or args.request_rate}: {rows[-1]['completed']} done in {duration:.1f} s",
                file=sys.stderr,
            )
        rss = peak_rss_bytes(base_url, args.api_key, proc)
        print(table(rows, rss))
        if args.output_json:
            config = {k: v for k, v in vars(args).items() if k not in ("api_key",)}
            Path(args.output_json).write_text(
                json.dumps(
                    {"config": config, "model": model, "peak_rss_bytes": rss, "results": rows}, indent=2
                )
            )
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
