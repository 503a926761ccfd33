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
PROMPTS = REPO / "vriksha/semantic/prompts"

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


def fitted_routes(tmp: Path) -> tuple[Path, object, object]:
    from vriksha.semantic.config import load_routes
    from vriksha.semantic.embedder import Embedder
    from vriksha.semantic.examples import fit_signal, load_examples

    routes = tmp / "routes.yaml"
    shutil.copy(PROMPTS / "routes.yaml", routes)
    cfg = load_routes(routes)
    sig = cfg.signals.classifier[0]
    embedder = Embedder(device=None)
    train = load_examples(PROMPTS / "train.jsonl", sig.labels)
    fit_signal(sig, train, embedder.encode)[0].save(cfg.head_path(sig))
    return routes, cfg, embedder


def accuracy(cfg, embedder) -> dict:
    from vriksha.semantic.examples import encode_all, load_examples
    from vriksha.semantic.signals import SignalSet

    sig = cfg.signals.classifier[0]
    held = load_examples(PROMPTS / "heldout.jsonl", sig.labels)
    clf = SignalSet(cfg, embedder.encode).classifiers[sig.name]
    emb = encode_all(embedder.encode, [e.text for e in held])
    right = sum(clf.predict(emb[i])[0] == e.label for i, e in enumerate(held))
    return {"heldout": len(held), "accuracy": right / len(held)}


async def _latency(cfg, embedder, n: int, concurrency: int, plain: bool = False) -> dict:
    """Classification latency, every text embedded afresh (the memo of repeated texts off: the held-out set
    is cycled). `plain`: as before the latency work: every text embedded (no cheap-signal shortcut), each
    batch padded to its longest text."""
    from vriksha.semantic.classify import RouteClassifier
    from vriksha.semantic.examples import load_examples

    cfg = cfg.model_copy(update={"embedding": cfg.embedding.model_copy(update={"memo_entries": 0})})
    embedder.bucket = not plain
    rc = RouteClassifier(cfg, embedder, eager=plain)
    texts = [e.text for e in load_examples(PROMPTS / "heldout.jsonl")]
    sizes: list[int] = []
    rc.batcher.on_batch = lambda k, _s: sizes.append(k)
    rc.batcher.start()
    for t in texts[:4]:
        await rc.classify(t)  # warm up
    sizes.clear()
    lat: list[float] = []
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            t0 = time.perf_counter()
            await rc.classify(texts[i % len(texts)])
            lat.append(time.perf_counter() - t0)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await rc.batcher.stop()
    embedder.bucket = True
    return {
        "requests": n,
        "concurrency": concurrency,
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "mean_batch": sum(sizes) / max(1, len(sizes)),
        "embedded": sum(sizes) / n,  # the share of requests that needed the embedding
        "classified_per_s": n / wall,
        "cpu_ms_per_request": cpu / n * 1000,  # what a loaded machine cannot distort
    }


def cache_quality(cfg, embedder) -> dict:
    from vriksha.semantic.cache import SemanticCache

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


def fleet_throughput(args: argparse.Namespace, tmp: Path, routes_path: Path) -> dict:
    from vriksha.semantic.examples import load_examples

    held = load_examples(PROMPTS / "heldout.jsonl")[: args.fleet_requests]
    args.replicas, args.threads = 2, args.threads
    fleet = Fleet(args, tmp)
    try:
        fast, careful = (r["url"] for r in fleet.replicas)
        routed = yaml.safe_load(routes_path.read_text())
        routed["pools"] = [
            {"name": "fast", "replicas": [fast], "tokenizer": args.model},
            {"name": "careful", "replicas": [careful], "tokenizer": args.model},
        ]
        routed["signals"]["classifier"][0]["head"] = str(routes_path.with_name("routes.intent.safetensors"))
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
    a, lat, c = res["accuracy"], res["latency"], res["cache"]
    rows = [
        (
            "held-out routing accuracy",
            f"{a['accuracy']:.3f} ({a['heldout']} prompts)",
            ">= 0.90",
            a["accuracy"] >= 0.9,
        ),
        (
            f"added latency p50 (c={lat['concurrency']})",
            f"{lat['p50_ms']:.1f} ms",
            "<= 10 ms",
            lat["p50_ms"] <= 10,
        ),
        (
            f"added latency p99 (c={lat['concurrency']})",
            f"{lat['p99_ms']:.1f} ms",
            "<= 30 ms",
            lat["p99_ms"] <= 30,
        ),
        ("mean embedding batch", f"{lat['mean_batch']:.1f}", "", None),
        ("requests that needed the embedding", f"{lat['embedded']:.2f}", "", None),
        ("CPU time per classified request", f"{lat['cpu_ms_per_request']:.1f} ms", "", None),
        ("added latency p50, one at a time", f"{res['latency_c1']['p50_ms']:.1f} ms", "", None),
        ("cache hit rate, paraphrases", f"{c['paraphrase_hit_rate']:.2f}", "", None),
        (
            "cache false hits, near misses",
            f"{c['near_miss_false_hits']} / {c['near_misses']}",
            "0",
            c["near_miss_false_hits"] == 0,
        ),
    ]
    plain = res.get("latency_plain")
    if plain:
        rows += [
            (
                "plain: p50 / p99 (every text embedded, one pad)",
                f"{plain['p50_ms']:.1f} / {plain['p99_ms']:.1f} ms",
                "",
                None,
            ),
            (
                "plain / now: CPU per request, p50",
                f"{plain['cpu_ms_per_request'] / lat['cpu_ms_per_request']:.2f}x, "
                f"{plain['p50_ms'] / lat['p50_ms']:.2f}x",
                "",
                None,
            ),
        ]
    f = res.get("fleet")
    if f:
        for name in ("routed", "one_pool"):
            x = f[name]
            rows.append(
                (
                    f"fleet {name}",
                    f"{x['req_per_s']:.2f} req/s, {x['tokens']} tokens, {x['ok']}/{x['requests']} ok",
                    "",
                    None,
                )
            )
        gain = f["routed"]["req_per_s"] / max(1e-9, f["one_pool"]["req_per_s"])
        rows.append(("routed / one pool throughput", f"{gain:.2f}x", "> 1", gain > 1))
    w = max(len(r[0]) for r in rows) + 2
    lines = [f"{'metric':<{w}}{'value':<44}{'target':<10}met"]
    for name, value, target, met in rows:
        lines.append(f"{name:<{w}}{value:<44}{target:<10}{'' if met is None else ('yes' if met else 'NO')}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--latency-requests", type=int, default=512, help="classified requests for the latency figures"
    )
    p.add_argument("--concurrency", type=int, default=16, help="concurrent requests for the latency figures")
    p.add_argument("--no-fleet", action="store_true", help="skip the fleet throughput comparison")
    p.add_argument("--fleet-requests", type=int, default=64, help="held-out prompts sent through each fleet")
    p.add_argument("--fleet-concurrency", type=int, default=8, help="concurrent requests against each fleet")
    p.add_argument("--fast-tokens", type=int, default=64, help="max_tokens in the fast pool")
    p.add_argument("--careful-tokens", type=int, default=256, help="max_tokens in the careful pool")
    p.add_argument("--model", default=None, help="the replicas' model (default: the embedded one)")
    p.add_argument("--threads", type=int, default=1, help="threads per replica")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="semantic-bench-"))
    routes, cfg, embedder = fitted_routes(tmp)
    res = {
        "torch_threads": torch.get_num_threads(),
        "accuracy": accuracy(cfg, embedder),
        "latency": asyncio.run(_latency(cfg, embedder, args.latency_requests, args.concurrency)),
        "latency_c1": asyncio.run(_latency(cfg, embedder, min(64, args.latency_requests), 1)),
        "latency_plain": asyncio.run(
            _latency(cfg, embedder, args.latency_requests, args.concurrency, plain=True)
        ),
        "cache": cache_quality(cfg, embedder),
    }
    if not args.no_fleet:
        res["fleet"] = fleet_throughput(args, tmp, routes)
    print(report(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
