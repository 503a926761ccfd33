"""The OpenAI-compatible API through the official `openai` client against a real `vriksha serve` subprocess
on a tiny random Llama: outputs equal the offline `LLM`, streaming equals non-streaming, `n`, `stop`, logprobs,
usage with cached tokens, /generate, 64 concurrent streams, disconnects abort, profiling."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vriksha import LLM, SamplingParams

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
MESSAGES = [{"role": "user", "content": "Write a short poem about trees."}]


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir, tmp_path_factory):
    profile_dir = tmp_path_factory.mktemp("profiles")
    s = server_factory(
        [
            "--model",
            str(tiny_model_dir),
            "--kv-cache-memory-gb",
            "0.05",
            "--served-model-name",
            MODEL,
            "tiny-alias",
            "--profile-dir",
            str(profile_dir),
        ]
    )
    s.profile_dir = profile_dir
    return s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return LLM(model=str(tiny_model_dir), kv_cache_memory_gb=0.05)


def greedy(max_tokens: int = 16, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_models_and_health(server, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, "tiny-alias"]
    health = httpx.get(f"{server.base_url}/health").json()
    assert health["status"] == "ok"


def test_completion_equals_offline_llm(client, llm):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    want = llm.generate(PROMPT, greedy(16), use_tqdm=False)[0]
    assert r.choices[0].text == want.outputs[0].text
    assert r.choices[0].finish_reason == want.outputs[0].finish_reason
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == len(want.outputs[0].token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_stream_equals_non_stream(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_equals_offline_llm(client, llm):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    want = llm.chat(MESSAGES, greedy(16))[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.outputs[0].text
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)


def test_chat_stream_and_max_completion_tokens(client):
    full = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert full.usage.completion_tokens == 10 and full.choices[0].finish_reason == "length"
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_completion_tokens=10,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_raw_sse_ends_with_done(server):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_n_and_seed(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    multi = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], max_tokens=4, temperature=0, n=2)
    assert sorted(c.index for c in multi.choices) == [0, 1, 2, 3]


def test_stop_string(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    stop = base[len(base) // 2 : len(base) // 2 + 3]
    if not stop.strip():
        pytest.skip(f"greedy text {base!r} has no usable stop string in its middle")
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[: base.index(stop)]


def test_completion_logprobs(client, llm):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    want = llm.generate(PROMPT, greedy(6, logprobs=3), use_tqdm=False)[0].outputs[0]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.token_logprobs == pytest.approx(want.token_logprobs, abs=1e-4)
    assert all(len(top) == 3 for top in lp.top_logprobs)
    # greedy: the sampled token is the most likely one
    assert all(
        max(top.values()) == pytest.approx(t, abs=1e-4)
        for top, t in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content)
    none = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert none.choices[0].logprobs is None


def test_cached_tokens_on_shared_prefix(server, client):
    prefix = " ".join(f"word{i}" for i in range(200))
    first = client.completions.create(model=MODEL, prompt=prefix + " first", max_tokens=2, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prefix + " second", max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens > 300
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 16, (cached, first.usage.prompt_tokens)
    assert server.metrics()["vriksha_prefix_cache_hit_rate"] > 0


def test_native_generate_token_ids(server, llm):
    ids = llm.tokenizer.encode(PROMPT)
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 8, "logprobs": 2}}
    r = httpx.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    want = llm.generate({"prompt_token_ids": ids}, greedy(8, logprobs=2), use_tqdm=False)[0].outputs[0]
    assert out["prompt_tokens"] == len(ids)
    assert out["outputs"][0]["token_ids"] == want.token_ids
    assert out["outputs"][0]["token_logprobs"] == pytest.approx(want.token_logprobs, abs=1e-4)
    assert all(len(step) >= 2 for step in out["outputs"][0]["top_logprobs"])
    batch = httpx.post(
        f"{server.base_url}/generate",
        json={"input_ids": [ids, ids[:5]], "sampling_params": {"temperature": 0, "max_tokens": 3}},
        timeout=60,
    ).json()
    assert [len(b["outputs"][0]["token_ids"]) for b in batch] == [3, 3]
    assert batch[0]["outputs"][0]["token_ids"] == want.token_ids[:3]


def test_async_client_64_concurrent_streams(server, aclient):
    async def one(i: int) -> tuple[str, str | None]:
        stream = await aclient.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count to {i}."}],
            max_tokens=8,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run() -> list[tuple[str, str | None]]:
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(run())
    assert len(results) == 64 and all(finish == "length" for _, finish in results)
    m = server.metrics()
    assert m["vriksha_num_requests_running"] == 0 and m["vriksha_server_requests_in_flight"] == 0
    assert m["vriksha_time_to_first_token_seconds_count"] >= 64


def _wait_idle(server, timeout: float) -> tuple[dict[str, float], float]:
    t0 = time.monotonic()
    while True:
        m = server.metrics()
        idle = m["vriksha_num_requests_running"] == 0 and m["vriksha_num_requests_waiting"] == 0
        if idle or time.monotonic() - t0 > timeout:
            return m, time.monotonic() - t0
        time.sleep(0.05)


def test_disconnect_mid_stream_aborts_and_frees_kv(server):
    assert httpx.post(f"{server.base_url}/flush_cache", timeout=30).status_code == 200
    idle_kv = server.metrics()["vriksha_kv_cache_used_tokens"]
    # each request would decode ~1900 tokens if not aborted: tens of seconds on this model
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1900, "stream": True, "ignore_eos": True}

    async def read_two_then_drop(c: httpx.AsyncClient) -> int:
        n = 0
        async with c.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= 2:
                    break
        return n

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(read_two_then_drop(c) for _ in range(8)))

    assert asyncio.run(run()) == [2] * 8
    m, waited = _wait_idle(server, timeout=5.0)
    assert m["vriksha_num_requests_running"] == 0, f"requests still running {waited:.1f} s after disconnect"
    assert m["vriksha_server_requests_in_flight"] == 0
    aborted = httpx.get(f"{server.base_url}/metrics").text
    assert 'vriksha_requests_total{endpoint="completions",finish_reason="abort"} 8.0' in aborted
    # the aborted requests hold no KV any more (what they left in the prefix cache is evictable, counted apart)
    assert m["vriksha_kv_cache_used_tokens"] == idle_kv, (m["vriksha_kv_cache_used_tokens"], idle_kv)


def test_disconnect_non_streaming_aborts(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=1.0)
    m, waited = _wait_idle(server, timeout=5.0)
    assert m["vriksha_num_requests_running"] == 0, f"request still running {waited:.1f} s after disconnect"


def test_profile_endpoints_write_trace(server, client):
    r = httpx.post(f"{server.base_url}/start_profile", json={}, timeout=30)
    assert r.status_code == 200, r.text
    assert httpx.post(f"{server.base_url}/start_profile", timeout=30).status_code == 409
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    r = httpx.post(f"{server.base_url}/stop_profile", timeout=120)
    assert r.status_code == 200, r.text
    trace = Path(r.json()["traces"][0])
    assert trace.parent == Path(server.profile_dir) and trace.exists()
    events = json.loads(gzip.decompress(trace.read_bytes()) if trace.suffix == ".gz" else trace.read_bytes())
    names = {e.get("name", "") for e in events["traceEvents"]}
    assert any(n.startswith("aten::") for n in names), (
        "no operator events: the engine thread was not profiled"
    )
    assert {"engine.sample", "server.parse"} <= names, sorted(n for n in names if "." in n and "::" not in n)[
        :20
    ]
    assert httpx.post(f"{server.base_url}/stop_profile", timeout=30).status_code == 409


def test_metrics_exposition(server, client):
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in (
        "vriksha_time_to_first_token_seconds_bucket",
        "vriksha_time_per_output_token_seconds_bucket",
        "vriksha_num_requests_running",
        "vriksha_num_requests_waiting",
        "vriksha_kv_cache_usage_ratio",
        "vriksha_prefix_cache_hit_rate",
        "vriksha_prompt_tokens_total",
        "vriksha_generation_tokens_total",
        "vriksha_process_peak_rss_bytes",
    ):
        assert name in text, name
    m = server.metrics()
    assert m["vriksha_generation_tokens_total"] > 0 and m["vriksha_prompt_tokens_total"] > 0
    steps = {
        s.labels["kind"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "vriksha_engine_step_seconds"
        for s in family.samples
        if s.name.endswith("_count")
    }
    assert set(steps) == {"decode", "prefill", "verify"}
    assert steps["decode"] > 0 and steps["prefill"] > 0


def test_native_generate_duplicate_request_id_leaves_the_first_running(server):
    body = {
        "input_ids": [5, 6, 7],
        "request_id": "dup",
        "stream": True,
        "sampling_params": {"temperature": 0, "max_tokens": 60, "ignore_eos": True},
    }
    with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=120) as first:
        lines = first.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
        dup = httpx.post(f"{server.base_url}/generate", json={**body, "stream": False}, timeout=60)
        assert dup.status_code == 400 and "already in use" in dup.json()["error"]["message"], dup.text
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["finished"] and events[-1]["outputs"][0]["finish_reason"] == "length"
    assert sum(len(e["outputs"][0]["token_ids"]) for e in events if e["outputs"]) >= 59
