"""The router's Prometheus metrics: requests, routing decisions, retries per replica; replica state at scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vriksha.net.metrics import MetricSet
from vriksha.router.replica import Replica

P = "vriksha_router"
_OVERHEAD_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)


class _ReplicaCollector(Collector):
    def __init__(self, replicas: Callable[[], list[Replica]]) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fams = {
            "healthy": GaugeMetricFamily(
                f"{P}_replica_healthy", "1 if the replica is in rotation", labels=["replica"]
            ),
            "in_flight": GaugeMetricFamily(
                f"{P}_replica_in_flight", "requests the router has open on the replica", labels=["replica"]
            ),
            "queue": GaugeMetricFamily(
                f"{P}_replica_queue", "running + waiting requests the replica reported", labels=["replica"]
            ),
            "kv": GaugeMetricFamily(
                f"{P}_replica_kv_usage", "the replica's KV pool usage", labels=["replica"]
            ),
            "tokens": GaugeMetricFamily(
                f"{P}_mirror_tokens",
                "tokens in the router's mirror of the replica's cache",
                labels=["replica"],
            ),
            "seq": GaugeMetricFamily(f"{P}_mirror_seq", "last KV event batch applied", labels=["replica"]),
        }
        for r in self._replicas():
            fams["healthy"].add_metric([r.url], 1.0 if r.healthy else 0.0)
            fams["in_flight"].add_metric([r.url], r.in_flight)
            fams["queue"].add_metric([r.url], r.load.num_running + r.load.num_waiting)
            fams["kv"].add_metric([r.url], r.load.kv_usage)
            if r.events is not None:
                fams["tokens"].add_metric([r.url], r.events.tree.size)
                fams["seq"].add_metric([r.url], r.events.seq)
        yield from fams.values()


class RouterMetrics(MetricSet):
    def __init__(self, replicas: Callable[[], list[Replica]]) -> None:
        super().__init__(P)
        c = self.counter
        self.requests = c(
            "requests", "requests by replica, endpoint and status", ["replica", "endpoint", "status"]
        )
        self.decisions = c(
            "decisions", "routing decisions by policy, replica and reason", ["policy", "replica", "reason"]
        )
        self.prompt_tokens = c("prompt_tokens", "prompt tokens routed", ["replica"])
        self.predicted_cached = c(
            "predicted_cached_tokens", "prompt tokens the policy expected cached", ["replica"]
        )
        self.retries = c("retries", "requests moved off a failed replica", ["replica"])
        self.stream_errors = c(
            "stream_errors", "streams cut because their replica failed mid-way", ["replica"]
        )
        self.ejections = c("ejections", "replicas taken out of rotation", ["replica"])
        self.readmissions = c("readmissions", "replicas put back in rotation", ["replica"])
        self.resyncs = c("resyncs", "mirror resyncs from a snapshot", ["replica", "reason"])
        self.pd_transfers = c(
            "pd_transfers",
            "prefill/decode transfers by prefill and decode replica and status (ok, skipped, failed)",
            ["prefill", "decode", "status"],
        )
        self.pd_tokens = c(
            "pd_fetched_tokens", "prompt tokens whose K/V moved to the decode replica", ["decode"]
        )
        self.pd_seconds = self.histogram(
            "pd_transfer_seconds",
            "time of a prefill/decode transfer (the prefill and the K/V move), before the request is forwarded",
            (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.overhead = self.histogram(
            "overhead_seconds",
            "time from the request's arrival to its forwarding (parse, tokenize, choose)",
            _OVERHEAD_BUCKETS,
        )
        self.read_at_scrape(_ReplicaCollector(replicas))
