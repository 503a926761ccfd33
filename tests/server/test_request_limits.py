"""A hostile client's requests against a real `vriksha serve` on loopback, through the `openai` client where
one is used: grammars that cannot work get 400 naming the problem, a grammar failing mid-generation and a
forced tool call that never came are errors (never a 200 with `finish_reason: stop`), admission counts
sequences (prompts x n), prompt log-probabilities are bounded, a flood of sequences does not starve a small
request, and /health answers while a 6 MB prompt is handled."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

MODEL = "tiny"
SEATS = 4  # --max-num-seqs: a flood queues


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--kv-cache-memory-gb", "0.05", "--served-model-name", MODEL]
    return server_factory([*args, "--max-num-seqs", str(SEATS), "--max-waiting", "256"])


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _wide_lark(n: int) -> str:
    """A free first token, then a row of `n` alternatives: past llguidance's 2,000 items only mid-generation."""
    rules = "\n".join(f'r{i}: "k{i}" "=" "{i}"' for i in range(n))
    return 'start: ("a" | "b") "{" (' + " | ".join(f"r{i}" for i in range(n)) + ') "}"\n' + rules


RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
WIDE = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(5000)]}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"structured_outputs": {"regex": "(a{1000}){1000}"}}, "regex cannot be used"),
        ({"structured_outputs": {"json": RECURSIVE}}, "json cannot be used"),
        ({"structured_outputs": {"json": WIDE}}, "5000 alternatives"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": RECURSIVE}}},
            "cannot",
        ),
    ],
    ids=["exploding-regex", "recursive-ref", "anyof-5000", "response-format-recursive"],
)
def test_grammars_that_cannot_work_get_400_naming_the_problem(client, extra, match):
    with pytest.raises(openai.BadRequestError, match=match):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "json"}], max_tokens=8, extra_body=extra
        )


@pytest.mark.slow
def test_a_grammar_failing_mid_generation_is_an_error_never_a_stop(client):
    extra = {"structured_outputs": {"grammar": _wide_lark(3000)}}
    with pytest.raises(openai.BadRequestError, match="structured output failed at its token 2") as caught:
        client.completions.create(model=MODEL, prompt="x", max_tokens=16, extra_body=extra)
    assert caught.value.code == "structured_output_failed"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "go"}],
        max_tokens=16,
        stream=True,
        extra_body=extra,
    )
    finishes = []
    with pytest.raises(openai.APIError, match="structured output failed"):
        for chunk in stream:
            finishes += [c.finish_reason for c in chunk.choices if c.finish_reason]
    assert finishes == []  # no choice ended as "stop"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.mark.slow
def test_a_forced_tool_call_that_never_came_is_an_error(client):
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, max_tokens=4)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError, match="max_tokens ran out before the call was complete"):
            client.chat.completions.create(**ask, tool_choice=choice)
        with pytest.raises(openai.APIError, match="max_tokens ran out"):
            for _ in client.chat.completions.create(**ask, tool_choice=choice, stream=True):
                pass
    done = client.chat.completions.create(**{**ask, "max_tokens": 300}, tool_choice="required")
    assert done.choices[0].message.tool_calls and done.choices[0].finish_reason in ("tool_calls", "length")


@pytest.mark.slow
def test_admission_counts_sequences_not_prompts(server):
    r = httpx.post(
        f"{server.base_url}/generate",
        json={"input_ids": [[1, 2, 3]] * 128, "sampling_params": {"n": 128, "max_tokens": 1}},
        timeout=60,
    )
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "too_many_sequences" and "16384 sequences" in err["message"]
    assert "--max-waiting" in err["message"]
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": MODEL, "prompt": ["a", "b", "c"], "n": 128, "max_tokens": 1},
        timeout=60,
    )
    assert r.status_code == 400 and "384 sequences (3 prompts x n=128)" in r.json()["error"]["message"]


@pytest.mark.slow
def test_prompt_logprobs_are_bounded_per_request(server):
    body = {"model": MODEL, "prompt": "hello " * 1500, "max_tokens": 1, "prompt_logprobs": 20}
    r = httpx.post(f"{server.base_url}/v1/completions", json={**body, "n": 20}, timeout=120)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "prompt_logprobs" and "--max-prompt-logprobs" in err["message"]
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200 and len(r.json()["choices"][0]["prompt_logprobs"]) > 1000


@pytest.mark.slow
def test_a_flood_of_sequences_does_not_starve_a_small_request(server):
    flood = {"model": MODEL, "prompt": "flood", "n": 128, "max_tokens": 8, "ignore_eos": True, "stream": True}
    finished: list[int] = []
    started = threading.Event()

    def read_flood() -> None:
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=flood, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                started.set()
                finished.extend(c["index"] for c in json.loads(line[6:])["choices"] if c["finish_reason"])

    reader = threading.Thread(target=read_flood)
    reader.start()
    assert started.wait(120)
    small = {"model": MODEL, "prompt": "small", "max_tokens": 2, "ignore_eos": True}
    r = httpx.post(f"{server.base_url}/v1/completions", json=small, timeout=300)
    flood_done = len(finished)
    reader.join(600)
    assert r.status_code == 200 and len(finished) == 128
    assert flood_done < 64, (
        f"the 2-token request waited until {flood_done} of the flood's 128 sequences ended"
    )


@pytest.mark.slow
def test_health_answers_while_a_6mb_prompt_is_handled(server):
    big = "hello world " * 500_000  # 6 MB
    results: dict[str, httpx.Response] = {}

    def send(name: str, path: str, body: dict) -> None:
        results[name] = httpx.post(f"{server.base_url}{path}", json=body, timeout=300)

    jobs = [
        ("completion", "/v1/completions", {"model": MODEL, "prompt": big, "max_tokens": 2}),
        ("chat", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": big}]}),
        ("tokenize", "/tokenize", {"prompt": big[: len(big) // 3]}),  # tokenized whole: seconds of work
    ]
    threads = [threading.Thread(target=send, args=job) for job in jobs]
    for t in threads:
        t.start()
    worst = 0.0
    while any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.05)
    assert worst < 1.0, f"/health took {worst:.1f} s while the large prompts were handled"
    for name in ("completion", "chat"):
        err = results[name].json()["error"]
        assert results[name].status_code == 400 and err["code"] == "context_length_exceeded", err
    assert results["tokenize"].status_code == 200 and results["tokenize"].json()["count"] > 100_000
