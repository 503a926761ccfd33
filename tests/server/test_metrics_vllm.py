"""A replica's /metrics carries vLLM's names beside vriksha's, as llm-d's endpoint picker and a vLLM dashboard
read them: scraped with prometheus_client's own parser after real OpenAI-client requests."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

EXPECTED_TYPES = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def scrape(url: str) -> dict:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(family, suffix: str = "") -> float:
    return sum(s.value for s in family.samples if s.name == family.name + suffix)


def test_vllm_named_metrics_have_vllm_types_labels_and_meaning(server_factory, tiny_model_dir):
    from openai import OpenAI

    server = server_factory(["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--kv-cache-memory-gb",
                             "0.05"])  # fmt: skip
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="x")
    before = scrape(server.base_url)
    assert {n: before[n].type for n in EXPECTED_TYPES if n in before} == EXPECTED_TYPES
    prompt = completion = 0
    for i in range(3):
        r = client.completions.create(model="tiny", prompt=f"Count to {i}:", max_tokens=5, temperature=0)
        prompt += r.usage.prompt_tokens
        completion += r.usage.completion_tokens
    after = scrape(server.base_url)
    for name in EXPECTED_TYPES:
        for s in after[name].samples:
            assert s.labels.get("model_name") == "tiny" and s.labels.get("engine") == "0", (name, s)
    assert value(after["vllm:prompt_tokens"], "_total") == prompt
    assert value(after["vllm:generation_tokens"], "_total") == completion
    # the same requests as vriksha's own histograms count, under vLLM's names
    for name, ours in (
        ("vllm:time_to_first_token_seconds", "vriksha_time_to_first_token_seconds"),
        ("vllm:e2e_request_latency_seconds", "vriksha_e2e_request_latency_seconds"),
    ):
        assert value(after[name], "_count") == 3 == value(after[ours], "_count")
        assert value(after[name], "_sum") == pytest.approx(value(after[ours], "_sum"))
        inf = [
            s.value for s in after[name].samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"
        ]
        assert inf == [3.0]
    # idle: nothing queued or running; the pool's usage is a fraction
    assert value(after["vllm:num_requests_waiting"]) == 0 and value(after["vllm:num_requests_running"]) == 0
    assert 0.0 <= value(after["vllm:kv_cache_usage_perc"]) <= 1.0
    assert value(after["vllm:kv_cache_usage_perc"]) == pytest.approx(
        value(after["vriksha_kv_cache_usage_ratio"])
    )
