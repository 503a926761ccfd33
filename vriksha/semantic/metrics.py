"""The semantic layer's Prometheus metrics (next to the router's per-replica ones on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

P = "vriksha_semantic"
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)


class SemanticMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.routes = Counter(
            f"{P}_routes", "requests by decision and pool", ["decision", "pool"], registry=r
        )
        self.fallthrough = Counter(
            f"{P}_fallthrough",
            "decisions skipped because their pool had no live replica",
            ["pool"],
            registry=r,
        )
        self.blocked = Counter(
            f"{P}_blocked", "requests refused by a block decision", ["decision"], registry=r
        )
        self.cache_hits = Counter(
            f"{P}_cache_hits", "answers served from the semantic cache", ["pool"], registry=r
        )
        self.cache_misses = Counter(
            f"{P}_cache_misses", "cacheable requests not found in the semantic cache", ["pool"], registry=r
        )
        self.embed_seconds = Histogram(
            f"{P}_embedding_seconds", "wait + embedding time per request", buckets=_BUCKETS, registry=r
        )
        self.decide_seconds = Histogram(
            f"{P}_decision_seconds",
            "signals (classifier included) and decision time per request",
            buckets=_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            f"{P}_embedding_batch_size",
            "texts per embedding batch",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
