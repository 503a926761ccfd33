"""The semantic layer's Prometheus metrics (next to the router's per-replica ones on /metrics)."""

from __future__ import annotations

from vriksha.net.metrics import MetricSet

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)


class SemanticMetrics(MetricSet):
    def __init__(self) -> None:
        super().__init__("vriksha_semantic")
        self.routes = self.counter("routes", "requests by decision and pool", ["decision", "pool"])
        self.fallthrough = self.counter(
            "fallthrough", "decisions skipped because their pool had no live replica", ["pool"]
        )
        self.blocked = self.counter("blocked", "requests refused by a block decision", ["decision"])
        self.cache_hits = self.counter("cache_hits", "answers served from the semantic cache", ["pool"])
        self.cache_misses = self.counter(
            "cache_misses", "cacheable requests not found in the semantic cache", ["pool"]
        )
        self.embed_seconds = self.histogram(
            "embedding_seconds", "wait + embedding time per request", _BUCKETS
        )
        self.decide_seconds = self.histogram(
            "decision_seconds", "signals (classifier included) and decision time per request", _BUCKETS
        )
        self.batch_size = self.histogram(
            "embedding_batch_size", "texts per embedding batch", (1, 2, 4, 8, 16, 32, 64)
        )
