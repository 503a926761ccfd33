"""The semantic router, measured: classifier accuracy on the held-out prompts, the latency the semantic layer
adds at concurrency 16 (embedding micro-batched), the semantic cache on paraphrases (hit rate) and near
misses (false hits), and the throughput of a routed fleet (a short-answer pool and a careful pool, one
replica each) against sending everything to one pool of both replicas with the careful settings.

    python benchmarks/semantic_router.py                                   # an idle machine, full sizes
    python benchmarks/semantic_router.py --latency-requests 32 --fleet-requests 6 \
        --fast-tokens 4 --careful-tokens 8                                 # a smoke run
    python benchmarks/semantic_router.py --no-fleet                        # the in-process parts only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router import Child, Fleet, free_port, launch, ready  # noqa: E402
from server_load import pct  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "vriksha/router/semantic/prompts"

# (cached request, a paraphrase that deserves the same answer)
PARAPHRASES = [
    ("What is the capital of France?", "what's the capital of France"),
    ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("How tall is Mount Everest?", "What is the height of Mount Everest?"),
    ("What is 17 * 23?", "what is 17*23"),
    ("Tell me a joke about cats", "Tell me a joke about cats, please"),
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("What causes the seasons on Earth?", "What causes Earth's seasons?"),
    ("Give me three tips for better sleep", "give me 3 tips for better sleep"),
    ("What is photosynthesis?", "what is photosynthesis"),
    ("Translate 'good morning' into Spanish", "Translate 'good morning' to Spanish"),
    ("How many bones are in the human body?", "How many bones does the human body have?"),
    ("What's the boiling point of water at sea level?", "What is the boiling point of water at sea level?"),
]
# (cached request, a close one whose answer differs)
NEAR_MISSES = [
    ("What is the capital of France?", "What is the capital of Germany?"),
    ("What is 17 * 23?", "What is 17 * 24?"),
    ("How do I reverse a list in Python?", "How do I reverse a list in JavaScript?"),
    ("Who wrote Pride and Prejudice?", "Who wrote Sense and Sensibility?"),
    ("How tall is Mount Everest?", "How tall is K2?"),
    ("Translate 'good morning' into Spanish", "Translate 'good morning' into French"),
    ("Give me three tips for better sleep", "Give me five tips for better sleep"),
    ("How do I enable SSH on Ubuntu?", "How do I disable SSH on Ubuntu?"),
    ("What is the boiling point of water at sea level?", "What is the freezing point of water at sea level?"),
    ("Convert 10 miles to kilometres", "Convert 10 kilometres to miles"),
    ("What is the square root of 144?", "What is the square root of 169?"),
    (
        "Who was the first president of the United States?",
        "Who was the second president of the United States?",
    ),
]


def fitted_routes(tmp: Path, mode: str) -> tuple[Path, object, object, float]:
    """The example routes in `tmp` with the embedding in `mode`, its classifier head fitted on the shipped
    training prompts; and the seconds the embedding took to load (static: the table read or built)."""
    from vriksha.router.semantic.config import load_routes
    from vriksha.router.semantic.embedder import embedder_for
    from vriksha.router.semantic.examples import fit_signal, load_examples

    tmp.mkdir(parents=True, exist_ok=True)
    routes = tmp / "routes.yaml"
    data = yaml.safe_load((PROMPTS / "routes.yaml").read_text())
    data["embedding"] = {**data.get("embedding", {}), "mode": mode}
    routes.write_text(yaml.safe_dump(data))
    cfg = load_routes(routes)
    sig = cfg.signals.classifier[0]
    t0 = time.perf_counter()
    embedder = embedder_for(cfg)
    load_s = time.perf_counter() - t0
    train = load_examples(PROMPTS / "train.jsonl", sig.labels)
    fit_signal(sig, train, embedder.encode)[0].save(cfg.head_path(sig), {"mode": mode})
    return routes, cfg, embedder, load_s


def accuracy(cfg, embedder) -> dict:
    from vriksha.router.semantic.examples import encode_all, load_examples
    from vriksha.router.semantic.signals import SignalSet

    sig = cfg.signals.classifier[0]
    held = load_examples(PROMPTS / "heldout.jsonl", sig.labels)
    clf = SignalSet(cfg, embedder.encode).classifiers[sig.name]
    emb = encode_all(embedder.encode, [e.text for e in held])
    right = sum(clf.predict(emb[i])[0] == e.label for i, e in enumerate(held))
    return {"heldout": len(held), "accuracy": right / len(held)}


async def _latency(
    cfg, embedder, n: int, concurrency: int, plain: bool = False, cache_embedder=None, cached: bool = False
) -> dict:
    """Classification latency, every text embedded afresh (the memo of repeated texts off: the held-out set
    is cycled). `plain`: as before the latency work: every text embedded (no cheap-signal shortcut), each
    batch padded to its longest text. `cached`: a cacheable request's path, the routing and then the
    vector the semantic cache compares by (the transformer's, `cache_embedder`, when routing is static)."""
    from vriksha.router.semantic.cache import SemanticCache
    from vriksha.router.semantic.classify import RouteClassifier
    from vriksha.router.semantic.examples import load_examples

    cfg = cfg.model_copy(update={"embedding": cfg.embedding.model_copy(update={"memo_entries": 0})})
    if plain:
        embedder.bucket = False
    rc = RouteClassifier(cfg, embedder, eager=plain, cache_embedder=cache_embedder if cached else None)
    texts = [e.text for e in load_examples(PROMPTS / "heldout.jsonl")]
    sizes: list[int] = []
    for b in rc.batchers:
        b.on_batch = lambda k, _s: sizes.append(k)
        b.start()
    embed, embedded = rc.embed, []

    async def counted(text: str):
        embedded.append(1)
        return await embed(text)

    rc.embed = counted
    for t in texts[:4]:
        await rc.classify(t)  # warm up
    sizes.clear()
    embedded.clear()
    lat: list[float] = []
    queue = list(range(n))

    cache = SemanticCache(cfg.cache)
    floor = cfg.cache.prefilter if rc.cache_batcher is not None else None
    deferred: list[int] = []

    async def worker() -> None:
        while queue:
            i = queue.pop()
            text = texts[i % len(texts)]
            scope = f"cycle {i // len(texts)}"  # one pass over the held-out set: every request a miss
            t0 = time.perf_counter()
            result = await rc.classify(text)
            if not cached:
                lat.append(time.perf_counter() - t0)
                continue
            static = result.emb if result.emb is not None or floor is None else (await rc.embed(text))[0]
            if floor is not None and not cache.might_hit(scope, static, floor):
                task = asyncio.ensure_future(rc.cache_vector(text, result.emb))  # while the pool answers
                lat.append(time.perf_counter() - t0)
                deferred.append(1)
                vec = (await task)[0]
            else:
                vec = (await rc.cache_vector(text, result.emb))[0]
                cache.lookup(scope, vec, text)
                lat.append(time.perf_counter() - t0)
            cache.store(scope, vec, text, b"answer", prefilter_emb=static if floor is not None else None)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for b in rc.batchers:
        await b.stop()
    if plain:
        embedder.bucket = True
    return {
        "requests": n,
        "concurrency": concurrency,
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "mean_batch": sum(sizes) / len(sizes) if sizes else None,  # None: not batched (static)
        "embedded": len(embedded) / n,  # the share of requests that needed the embedding
        "classified_per_s": n / wall,
        "cpu_ms_per_request": cpu / n * 1000,  # what a loaded machine cannot distort
        "cache_vector_deferred": len(deferred) / n if cached else None,  # misses by the static prefilter
    }


def cache_quality(cfg, embedder) -> dict:
    """Hits on paraphrases and false hits on near misses, with the vectors the cache compares by (`embedder`:
    the transformer's, whichever embedding routes)."""
    from vriksha.router.semantic.cache import SemanticCache

    def run(pairs: list[tuple[str, str]]) -> int:
        cache = SemanticCache(cfg.cache)
        a = embedder.encode([p[0] for p in pairs])
        b = embedder.encode([p[1] for p in pairs])
        for i, (orig, _) in enumerate(pairs):
            cache.store(f"s{i}", a[i], orig, b"answer")
        return sum(cache.lookup(f"s{i}", b[i], new) is not None for i, (_, new) in enumerate(pairs))

    hits, false = run(PARAPHRASES), run(NEAR_MISSES)
    return {
        "threshold": cfg.cache.threshold,
        "paraphrase_hit_rate": hits / len(PARAPHRASES),
        "near_miss_false_hits": false,
        "near_misses": len(NEAR_MISSES),
    }


def _router(fleet: Fleet, routes: dict, tmp: Path, name: str) -> tuple[str, Child]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(routes))
    port = free_port()
    cmd = [sys.executable, "-m", "vriksha.cli", "router", "--config", str(path), "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    proc = launch(cmd, name, fleet.log_dir, url)
    ready([proc], fleet.log_dir)
    return url, proc


async def _drive(url: str, bodies: list[dict], concurrency: int) -> tuple[float, int, int]:
    queue = list(bodies)
    ok = tokens = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal ok, tokens
        while queue:
            r = await client.post(f"{url}/v1/chat/completions", json=queue.pop(0), timeout=600)
            if r.status_code == 200:
                ok += 1
                tokens += r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return time.perf_counter() - t0, ok, tokens


def fleet_throughput(args: argparse.Namespace, tmp: Path, routes_path: Path, head: Path) -> dict:
    """`routes_path` (its classifier head fitted at `head`) in front of a fast and a careful replica,
    against one pool of both replicas answering everything with the careful settings."""
    from vriksha.router.semantic.examples import load_examples

    held = load_examples(PROMPTS / "heldout.jsonl")[: args.fleet_requests]
    args.replicas, args.kv_tokens = 2, 0  # two replicas, each with the engine's default KV pool
    fleet = Fleet(args, tmp)
    try:
        fast, careful = (r["url"] for r in fleet.replicas)
        routed = yaml.safe_load(routes_path.read_text())
        routed["pools"] = [
            {"name": "fast", "replicas": [fast], "tokenizer": args.model},
            {"name": "careful", "replicas": [careful], "tokenizer": args.model},
        ]
        routed["signals"]["classifier"][0]["head"] = str(head)
        routed["cache"]["enabled"] = False
        for d in routed["decisions"]:
            if "sampling" in d:
                tokens = args.careful_tokens if d.get("pool") == "careful" else args.fast_tokens
                d["sampling"] = {**d["sampling"], "max_tokens": tokens, "temperature": 0}
        routed["default"]["sampling"] = {"max_tokens": args.fast_tokens, "temperature": 0}
        one = {
            "pools": [
                {"name": "big", "replicas": [fast, careful], "policy": "least_load", "tokenizer": args.model}
            ],
            "default": {"pool": "big"},
        }
        out = {}
        for name, routes, model in (("routed", routed, "auto"), ("one_pool", one, "big")):
            url, proc = _router(fleet, routes, tmp, name)
            bodies = [
                {
                    "model": model,
                    "messages": [{"role": "user", "content": e.text}],
                    "temperature": 0,
                    "max_tokens": args.careful_tokens,
                }
                for e in held
            ]
            wall, ok, tokens = asyncio.run(_drive(url, bodies, args.fleet_concurrency))
            proc.stop(30)
            out[name] = {
                "requests": len(bodies),
                "ok": ok,
                "wall_s": wall,
                "req_per_s": ok / wall,
                "tokens": tokens,
            }
        return out
    finally:
        fleet.stop()


def report(res: dict) -> str:
    modes = list(res["modes"])
    default = res["default_mode"]
    rows: list[tuple[str, list[str], str, bool | None]] = []

    def row(name: str, fmt, target: str = "", met=None) -> None:
        vals = [fmt(res["modes"][m]) for m in modes]
        ok = met(res["modes"][default]) if met is not None and default in res["modes"] else None
        rows.append((name, vals, target, ok))

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} ms"

    row("embedding load (static: table read or built)", lambda m: f"{m['load_s']:.1f} s")
    row(
        "held-out routing accuracy",
        lambda m: f"{m['accuracy']['accuracy']:.3f} ({m['accuracy']['heldout']})",
        ">= 0.90",
        lambda m: m["accuracy"]["accuracy"] >= 0.9,
    )
    row(
        "added latency p50 (c=16)",
        lambda m: ms(m["latency"]["p50_ms"]),
        "<= 10 ms",
        lambda m: m["latency"]["p50_ms"] <= 10,
    )
    row(
        "added latency p99 (c=16)",
        lambda m: ms(m["latency"]["p99_ms"]),
        "<= 30 ms",
        lambda m: m["latency"]["p99_ms"] <= 30,
    )
    row("added latency p50, one at a time", lambda m: ms(m["latency_c1"]["p50_ms"]))
    row("CPU time per classified request", lambda m: ms(m["latency"]["cpu_ms_per_request"]))
    row(
        "mean embedding batch",
        lambda m: "-" if m["latency"]["mean_batch"] is None else f"{m['latency']['mean_batch']:.1f}",
    )
    row("requests that needed the embedding", lambda m: f"{m['latency']['embedded']:.2f}")
    row(
        "cacheable request p50 / p99 (c=16, + cache lookup)",
        lambda m: f"{m['latency_cached']['p50_ms']:.1f} / {m['latency_cached']['p99_ms']:.1f} ms",
        "<= 10 / 30 ms",
        lambda m: m["latency_cached"]["p50_ms"] <= 10 and m["latency_cached"]["p99_ms"] <= 30,
    )
    row(
        "cacheable: transformer vector off the request's path",
        lambda m: (
            "-"
            if m["latency_cached"].get("cache_vector_deferred") is None
            else f"{m['latency_cached']['cache_vector_deferred']:.2f} (static prefilter: a miss at once)"
        ),
    )
    row("cache embedding", lambda m: "transformer")
    row("cache threshold", lambda m: f"{m['cache']['threshold']:.2f}")
    row("cache hit rate, paraphrases", lambda m: f"{m['cache']['paraphrase_hit_rate']:.2f}")
    row(
        "cache false hits, near misses",
        lambda m: f"{m['cache']['near_miss_false_hits']} / {m['cache']['near_misses']}",
        "0",
        lambda m: m["cache"]["near_miss_false_hits"] == 0,
    )
    row(
        "plain p50 / p99 (every text embedded, one pad)",
        lambda m: (
            "-"
            if "latency_plain" not in m
            else f"{m['latency_plain']['p50_ms']:.1f} / {m['latency_plain']['p99_ms']:.1f} ms"
        ),
    )
    if "static" in res["modes"] and "transformer" in res["modes"]:
        s, t = res["modes"]["static"]["latency"], res["modes"]["transformer"]["latency"]
        rows.append(
            (
                "transformer / static: CPU per request, p50",
                [
                    f"{t['cpu_ms_per_request'] / max(1e-9, s['cpu_ms_per_request']):.1f}x, "
                    f"{t['p50_ms'] / max(1e-9, s['p50_ms']):.1f}x"
                ]
                + [""] * (len(modes) - 1),
                "",
                None,
            )
        )
    f = res.get("fleet")
    if f:
        for name in ("routed", "one_pool"):
            x = f[name]
            text = f"{x['req_per_s']:.2f} req/s, {x['tokens']} tokens, {x['ok']}/{x['requests']} ok"
            rows.append((f"fleet {name} ({default})", [text] + [""] * (len(modes) - 1), "", None))
        gain = f["routed"]["req_per_s"] / max(1e-9, f["one_pool"]["req_per_s"])
        rows.append(
            ("routed / one pool throughput", [f"{gain:.2f}x"] + [""] * (len(modes) - 1), "> 1", gain > 1)
        )
    w = max(len(r[0]) for r in rows) + 2
    cw = max(18, *(len(v) + 2 for r in rows for v in r[1]))
    head = "".join(f"{m + (' (default)' if m == default else ''):<{cw}}" for m in modes)
    lines = [f"{'metric':<{w}}{head}{'target':<10}met ({default})"]
    for name, vals, target, met in rows:
        cells = "".join(f"{v:<{cw}}" for v in vals)
        lines.append(f"{name:<{w}}{cells}{target:<10}{'' if met is None else ('yes' if met else 'NO')}")
    return "\n".join(lines)


def measure(mode: str, args: argparse.Namespace, tmp: Path) -> tuple[dict, Path, Path]:
    """Every in-process figure for one embedding mode; and its routes file and fitted head."""
    from vriksha.router.semantic.embedder import embedder_for

    routes, cfg, embedder, load_s = fitted_routes(tmp / mode, mode)
    cache_embedder = embedder if mode == "transformer" else embedder_for(cfg, "transformer")
    n, c = args.latency_requests, args.concurrency
    out = {
        "load_s": load_s,
        "accuracy": accuracy(cfg, embedder),
        "latency": asyncio.run(_latency(cfg, embedder, n, c)),
        "latency_c1": asyncio.run(_latency(cfg, embedder, min(64, n), 1)),
        "latency_cached": asyncio.run(
            _latency(cfg, embedder, n, c, cache_embedder=cache_embedder, cached=True)
        ),
        "cache": cache_quality(cfg, cache_embedder),
    }
    if mode == "transformer":
        out["latency_plain"] = asyncio.run(
            _latency(cfg, embedder, args.latency_requests, args.concurrency, plain=True)
        )
    return out, routes, cfg.head_path(cfg.signals.classifier[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--latency-requests", type=int, default=512, help="classified requests for the latency figures"
    )
    p.add_argument("--concurrency", type=int, default=16, help="concurrent requests for the latency figures")
    p.add_argument(
        "--modes",
        default="static,transformer",
        help="embedding modes measured side by side (comma-separated)",
    )
    p.add_argument("--no-fleet", action="store_true", help="skip the fleet throughput comparison")
    p.add_argument("--fleet-requests", type=int, default=64, help="held-out prompts sent through each fleet")
    p.add_argument("--fleet-concurrency", type=int, default=8, help="concurrent requests against each fleet")
    p.add_argument("--fast-tokens", type=int, default=64, help="max_tokens in the fast pool")
    p.add_argument("--careful-tokens", type=int, default=256, help="max_tokens in the careful pool")
    p.add_argument("--model", default=None, help="the replicas' model (default: the embedded one)")
    p.add_argument("--threads", type=int, default=1, help="threads per replica")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    from vriksha.router.semantic.config import EmbeddingConfig

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("static", "transformer")]
    if bad or not modes:
        p.error(f"--modes: {bad or modes} not among static, transformer")
    tmp = Path(tempfile.mkdtemp(prefix="semantic-bench-"))
    default = EmbeddingConfig().mode
    res: dict = {"torch_threads": torch.get_num_threads(), "default_mode": default, "modes": {}}
    fitted = {}
    for mode in modes:
        res["modes"][mode], *fitted[mode] = measure(mode, args, tmp)
    if not args.no_fleet:
        mode = default if default in fitted else modes[0]
        res["fleet"] = fleet_throughput(args, tmp, *fitted[mode])
    print(report(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
