"""`vriksha route fit|eval`: train the classifier head of a routes file on labelled prompts, and measure it
(accuracy, confusion matrix, latency split) on a held-out set."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "route",
        help="fit and evaluate the semantic router's classifier head",
        description="Fit the classifier signal of a routes file on labelled prompts, or evaluate it. "
        "See docs/semantic_router.md.",
    )
    sub = p.add_subparsers(dest="route_command", metavar="ACTION", required=True)
    f = sub.add_parser("fit", help="fit the classifier head; stored next to the routes file")
    f.add_argument("routes", help="the routes YAML")
    f.add_argument("examples", help='JSON lines of {"text": ..., "label": ...}')
    f.add_argument("--signal", default=None, help="the classifier signal (when the file has several)")
    f.add_argument("--l2", type=float, default=1e-3, help="L2 penalty on the head's weights (default: 1e-3)")
    f.set_defaults(func=fit_command)
    e = sub.add_parser("eval", help="accuracy, confusion matrix and latency split on held-out prompts")
    e.add_argument("routes", help="the routes YAML (its head fitted)")
    e.add_argument("examples", help="held-out JSON lines of {text, label}")
    e.add_argument("--signal", default=None, help="the classifier signal (when the file has several)")
    e.set_defaults(func=eval_command)


def _setup(args: argparse.Namespace):
    from vriksha.router.semantic.config import load_routes
    from vriksha.router.semantic.embedder import embedder_for
    from vriksha.router.semantic.examples import classifier_signal, load_examples

    cfg = load_routes(args.routes)
    sig = classifier_signal(cfg, args.signal)
    examples = load_examples(args.examples, sig.labels)
    return cfg, sig, examples, embedder_for(cfg)


def fit_command(args: argparse.Namespace) -> int:
    from vriksha.router.semantic.examples import fit_signal

    cfg, sig, examples, embedder = _setup(args)
    t0 = time.perf_counter()
    head, acc = fit_signal(sig, examples, embedder.encode, l2=args.l2)
    path = cfg.head_path(sig)
    head.save(path, {"examples": str(len(examples)), "embedding": embedder.path.name, "mode": embedder.mode})
    print(f"fitted {sig.name} on {len(examples)} examples in {time.perf_counter() - t0:.1f} s")
    print(f"training accuracy {acc:.3f}; head written to {path}")
    return 0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def eval_command(args: argparse.Namespace) -> int:
    from vriksha.router.semantic.classify import RouteClassifier

    cfg, sig, examples, embedder = _setup(args)
    no_cache = cfg.model_copy(update={"cache": cfg.cache.model_copy(update={"enabled": False})})
    rc = RouteClassifier(no_cache, embedder)  # the routing alone: no cache, so no cache embedder
    classifier = rc.signals.classifiers[sig.name]
    for e in examples[:3]:  # warm up
        embedder.encode([e.text])
    n = len(sig.labels)
    confusion = [[0] * n for _ in range(n)]
    t_embed, t_cls, t_dec = [], [], []
    routed: dict[str, int] = {}
    for ex in examples:
        t0 = time.perf_counter()
        emb = embedder.encode([ex.text])[0]
        t1 = time.perf_counter()
        label, _ = classifier.predict(emb)
        t2 = time.perf_counter()
        result = rc.decide(ex.text, emb)
        t3 = time.perf_counter()
        t_embed.append(t1 - t0)
        t_cls.append(t2 - t1)
        t_dec.append(max(0.0, (t3 - t2) - (t2 - t1)))  # the other signals and the rules
        confusion[sig.labels.index(ex.label)][sig.labels.index(label)] += 1
        first = result.routes[0]
        routed[f"{first.decision}->{first.pool}"] = routed.get(f"{first.decision}->{first.pool}", 0) + 1
    correct = sum(confusion[i][i] for i in range(n))
    print(f"{sig.name}: accuracy {correct / len(examples):.3f} on {len(examples)} held-out prompts")
    width = max(8, *(len(lbl) for lbl in sig.labels))
    print("confusion (rows: true, columns: predicted)")
    print(" " * width + "".join(f"{lbl[:width]:>{width + 1}}" for lbl in sig.labels))
    for i, lbl in enumerate(sig.labels):
        print(f"{lbl:<{width}}" + "".join(f"{c:>{width + 1}}" for c in confusion[i]))
    print("latency per prompt (ms)    p50      p99     mean")
    for name, xs in (("embedding", t_embed), ("classification", t_cls), ("decision", t_dec)):
        print(
            f"  {name:<22}{_pct(xs, 0.5):>7.2f}  {_pct(xs, 0.99):>7.2f}  {statistics.fmean(xs) * 1000:>7.2f}"
        )
    print("first route taken: " + ", ".join(f"{k} {v}" for k, v in sorted(routed.items())))
    return 0
