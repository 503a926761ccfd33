"""A component's Prometheus metrics: a registry of its own (several apps in one process, as in tests, do not
collide), every name under one prefix, and the text /metrics answers."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector


class MetricSet:
    """Declare metrics as `self.x = self.counter("x", "what x counts", ["label"])`; `render()` for /metrics."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.registry = CollectorRegistry()

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(f"{self.prefix}_{name}", doc, list(labels), registry=self.registry)

    def histogram(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return Histogram(
            f"{self.prefix}_{name}", doc, list(labels), buckets=tuple(buckets), registry=self.registry
        )

    def read_at_scrape(self, collector: Collector) -> None:
        """`collector.collect()` runs on every scrape (gauges read from live state)."""
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
