"""Prometheus metrics: latency histograms and token counters observed by the server, engine gauges read at scrape."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from vriksha.engine.core.stats import STEP_BUCKETS, StepTimes
from vriksha.net.metrics import MetricSet

PREFIX = "vriksha"
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_TPOT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


class _EngineCollector(Collector):
    """Reads `engine.stats()` and the admission counters at scrape time."""

    def __init__(
        self, stats: Callable[[], Any], waiting: Callable[[], int], in_flight: Callable[[], int]
    ) -> None:
        self._stats = stats
        self._waiting = waiting
        self._in_flight = in_flight

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        yield gauge("num_requests_running", "requests the engine is decoding", s.num_running)
        yield gauge("num_requests_waiting", "requests queued in the engine, not yet scheduled", s.num_waiting)
        yield gauge(
            "server_requests_waiting",
            "sequences (prompts x n) admitted by the server without a first token yet (bound: --max-waiting)",
            self._waiting(),
        )
        yield gauge("server_requests_in_flight", "requests the server is serving", self._in_flight())
        yield gauge(
            "kv_cache_used_tokens",
            "KV pool slots held by requests and locked prefix-cache entries",
            s.kv_used_tokens,
        )
        yield gauge(
            "kv_cache_evictable_tokens",
            "KV pool slots held by unlocked prefix-cache entries (freed on demand)",
            getattr(s, "kv_cached_tokens", 0),
        )
        yield gauge("kv_cache_total_tokens", "KV pool capacity in tokens", s.kv_total_tokens)
        total = max(1, s.kv_total_tokens)
        yield gauge("kv_cache_usage_ratio", "fraction of the KV pool in use", s.kv_used_tokens / total)
        hit = s.cached_prompt_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
        yield gauge("prefix_cache_hit_rate", "cached prompt tokens / prompt tokens, since start", hit)
        yield gauge(
            "engine_prompt_tokens", "prompt tokens the engine has admitted, since start", s.prompt_tokens
        )
        yield gauge(
            "engine_cached_prompt_tokens",
            "prompt tokens served from the prefix cache, since start",
            s.cached_prompt_tokens,
        )
        yield gauge(
            "engine_generation_tokens", "tokens the engine has generated, since start", s.generation_tokens
        )
        proposed, accepted = getattr(s, "spec_draft_tokens", 0), getattr(s, "spec_accepted_tokens", 0)
        yield gauge("spec_draft_tokens", "tokens proposed by speculative decoding, since start", proposed)
        yield gauge(
            "spec_accepted_tokens", "proposed tokens the model's own sampling kept, since start", accepted
        )
        yield gauge(
            "spec_acceptance_rate", "accepted / proposed tokens, since start", accepted / max(1, proposed)
        )
        runs, emitted = getattr(s, "spec_runs", 0), getattr(s, "spec_emitted_tokens", 0)
        yield gauge(
            "spec_tokens_per_step",
            "tokens a request emitted per step that verified proposals, since start (1 would be no gain)",
            emitted / max(1, runs),
        )
        yield gauge(
            "kv_cache_pinned_tokens",
            "KV pool slots that open sessions pin against eviction (part of the used slots)",
            getattr(s, "kv_pinned_tokens", 0),
        )
        yield gauge(
            "sessions_open", "sessions open (requests carrying a session id)", getattr(s, "open_sessions", 0)
        )
        yield gauge(
            "sessions_pinned", "open sessions holding a pinned prefix", getattr(s, "pinned_sessions", 0)
        )
        yield gauge(
            "sessions_pins_released_for_memory",
            "session pins released to make room (pinned share full or a running request short), since start",
            getattr(s, "sessions_released_for_memory", 0),
        )
        yield gauge(
            "sessions_timed_out",
            "sessions closed after idling past their timeout, since start",
            getattr(s, "sessions_timed_out", 0),
        )
        yield gauge(
            "kv_tier_total_tokens",
            "the second KV tier's capacity in tokens (0: off)",
            getattr(s, "kv_tier_total_tokens", 0),
        )
        yield gauge("kv_tier_tokens", "tokens held in the second KV tier", getattr(s, "kv_tier_tokens", 0))
        yield gauge(
            "kv_tier_written_tokens",
            "tokens written to the second KV tier on eviction, since start",
            getattr(s, "kv_tier_written_tokens", 0),
        )
        yield gauge(
            "kv_tier_loaded_tokens",
            "tokens loaded back from the second KV tier instead of recomputed, since start",
            getattr(s, "kv_tier_loaded_tokens", 0),
        )
        yield gauge("process_peak_rss_bytes", "peak resident memory of the server process", peak_rss_bytes())
        times = getattr(s, "step_times", None)
        if times is not None:
            yield step_histogram(times)
        if getattr(s, "max_loras", 0):
            yield lora_requests_info(s.running_loras, s.waiting_loras, s.max_loras)


def lora_requests_info(running: Sequence[str], waiting: Sequence[str], max_loras: int) -> GaugeMetricFamily:
    """vLLM's `vllm:lora_requests_info`: the adapters of running and waiting requests as comma-separated
    labels, and --max-loras; its value is the time of the scrape, as vLLM's is the time it was last set."""
    family = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    family.add_metric([",".join(running), ",".join(waiting), str(max_loras)], time.time())
    return family


def step_histogram(times: StepTimes) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        f"{PREFIX}_engine_step_seconds",
        "engine step duration (schedule, forward, sampling) by kind: decode, prefill (a step carrying a "
        "prompt chunk), verify (speculative drafts)",
        labels=["kind"],
    )
    for kind, counts in times.counts.items():
        cumulative, buckets = 0, []
        for bound, count in zip((*STEP_BUCKETS, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        family.add_metric([kind], buckets, sum_value=times.sums[kind])
    return family


class ServerMetrics(MetricSet):
    """One registry per app, so several apps in one process (tests) do not collide."""

    def __init__(
        self, stats: Callable[[], Any], waiting: Callable[[], int], in_flight: Callable[[], int]
    ) -> None:
        super().__init__(PREFIX)
        self.ttft = self.histogram("time_to_first_token_seconds", "time to first token", _TTFT_BUCKETS)
        self.tpot = self.histogram(
            "time_per_output_token_seconds", "time per output token after the first", _TPOT_BUCKETS
        )
        self.e2e = self.histogram("e2e_request_latency_seconds", "request latency", _E2E_BUCKETS)
        self.prompt_tokens = self.counter("prompt_tokens", "prompt tokens of finished requests")
        self.cached_tokens = self.counter(
            "cached_prompt_tokens", "prompt tokens served from the prefix cache"
        )
        self.generation_tokens = self.counter("generation_tokens", "generated tokens of finished requests")
        self.requests = self.counter(
            "requests", "requests by endpoint and outcome", ["endpoint", "finish_reason"]
        )
        ProcessCollector(registry=self.registry)
        self.read_at_scrape(_EngineCollector(stats, waiting, in_flight))
