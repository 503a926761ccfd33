"""vLLM's metric names beside vriksha's own, so that a replica is a model server that llm-d's endpoint picker
(the Gateway API Inference Extension's model server protocol) and a vLLM Grafana dashboard read as they read vLLM.

Same types and meaning as vLLM's (v1 engine), labelled as vLLM labels them (`model_name`, `engine`):
- `vllm:num_requests_waiting` (gauge): requests queued in the engine, not yet scheduled;
- `vllm:num_requests_running` (gauge): requests in the engine's running batch;
- `vllm:kv_cache_usage_perc` (gauge): fraction of the KV pool held (by requests and locked prefix-cache
  entries; unlocked cached entries are free to evict, as vLLM counts its free-queue blocks), 1 = full;
- `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` (counters): prompt tokens the engine has taken
  in and tokens it has generated, counted as it goes (not when a request ends);
- `vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`, `vllm:e2e_request_latency_seconds`
  (histograms): the server's own latency histograms, under vLLM's names (vriksha's bucket bounds).
Read at scrape time from the engine's statistics and the server's histograms: nothing is observed twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = ["VllmNames", "install_vllm_metrics"]

LABELS = ["model_name", "engine"]
ENGINE_INDEX = "0"  # one engine per replica (vLLM numbers its data-parallel engines)


def _renamed(source: Histogram, name: str, doc: str, values: list[str]) -> HistogramMetricFamily:
    """The histogram `source` (unlabelled) under another name, labelled with `values`."""
    family = HistogramMetricFamily(name, doc, labels=LABELS)
    buckets: list[tuple[str, float]] = []
    total = 0.0
    for metric in source.collect():
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                buckets.append((s.labels["le"], s.value))
            elif s.name.endswith("_sum"):
                total = s.value
    family.add_metric(values, buckets, sum_value=total)
    return family


class VllmNames(Collector):
    """The vLLM-named metrics of one server, read at scrape."""

    def __init__(self, metrics: Any, stats: Callable[[], Any], model_name: Callable[[], str]) -> None:
        self._metrics = metrics
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        s = self._stats()
        labels = [self._model_name(), ENGINE_INDEX]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(labels, value)
            return c

        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running
        )
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        usage = s.kv_used_tokens / s.kv_total_tokens if s.kv_total_tokens else 0.0
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
        m = self._metrics
        for source, name, doc in (
            (m.ttft, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
            (m.tpot, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."),
            (m.e2e, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
        ):
            yield _renamed(source, name, doc, labels)


def install_vllm_metrics(metrics: Any, stats: Callable[[], Any], model_name: Callable[[], str]) -> None:
    """Serve the vLLM-named metrics on `metrics`' registry (a `ServerMetrics`) beside vriksha's."""
    metrics.read_at_scrape(VllmNames(metrics, stats, model_name))
