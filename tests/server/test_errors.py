"""Bad input by raw HTTP against a real server with `--api-key` and a waiting bound: each error gets its status
and a clear message in OpenAI's schema, and the server keeps serving the next request."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

KEY = "sk-test-key"
MODEL = "tiny"
MAX_BODY = 65536


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    return server_factory(
        [
            "--model",
            str(tiny_model_dir),
            "--kv-cache-memory-gb",
            "0.05",
            "--served-model-name",
            MODEL,
            "--max-num-seqs",
            "1",
            "--max-waiting",
            "1",
            "--max-body-bytes",
            str(MAX_BODY),
        ],
        api_key=KEY,
    )


def post(
    server, path: str, body=None, *, content: bytes | None = None, key: str | None = KEY, **kw
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if content is not None:
        headers["Content-Type"] = "application/json"
        return httpx.post(f"{server.base_url}{path}", content=content, headers=headers, timeout=60, **kw)
    return httpx.post(f"{server.base_url}{path}", json=body, headers=headers, timeout=60, **kw)


def ok_request(server) -> None:
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

CASES = [
    # (name, path, body or raw bytes, status, substring of the message, param)
    ("malformed json", "/v1/completions", b'{"model": "tiny", "prompt": ', 400, "not valid JSON", None),
    ("not an object", "/v1/chat/completions", b"[1, 2, 3]", 400, "", None),
    (
        "max_tokens as string",
        "/v1/completions",
        {**COMPLETION, "max_tokens": "2"},
        400,
        "max_tokens",
        "max_tokens",
    ),
    (
        "temperature as string",
        "/v1/chat/completions",
        {**CHAT, "temperature": "hot"},
        400,
        "temperature",
        "temperature",
    ),
    ("messages not a list", "/v1/chat/completions", {**CHAT, "messages": "hi"}, 400, "messages", "messages"),
    (
        "bad role",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "role",
        None,
    ),
    (
        "missing prompt",
        "/v1/completions",
        {"model": MODEL},
        400,
        "missing required parameter: prompt",
        "prompt",
    ),
    (
        "unknown field",
        "/v1/completions",
        {**COMPLETION, "bogus_field": 1},
        400,
        "unrecognized request argument supplied: bogus_field",
        "bogus_field",
    ),
    (
        "unknown chat field",
        "/v1/chat/completions",
        {**CHAT, "max_new_tokens": 3},
        400,
        "unrecognized request argument supplied: max_new_tokens",
        None,
    ),
    ("negative temperature", "/v1/completions", {**COMPLETION, "temperature": -1}, 400, "temperature", None),
    ("n too large", "/v1/completions", {**COMPLETION, "n": 1000}, 400, "at most 128", "n"),
    ("zero max_tokens", "/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
    (
        "top_logprobs without logprobs",
        "/v1/chat/completions",
        {**CHAT, "top_logprobs": 2},
        400,
        "logprobs",
        "top_logprobs",
    ),
    ("empty prompt", "/v1/completions", {**COMPLETION, "prompt": ""}, 400, "empty", "prompt"),
    (
        "image content",
        "/v1/chat/completions",
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}
            ],
        },
        400,
        "image_url",
        None,
    ),
    ("unknown model", "/v1/completions", {**COMPLETION, "model": "gpt-17"}, 404, "gpt-17", "model"),
    # numbers: finite floats only, integers in range, the same n cap on every endpoint
    (
        "NaN temperature",
        "/v1/completions",
        b'{"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": NaN}',
        400,
        "finite",
        "temperature",
    ),
    (
        "Infinity temperature",
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
        400,
        "finite",
        "temperature",
    ),
    (
        "NaN temperature on /generate",
        "/generate",
        b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN, "max_tokens": 2}}',
        400,
        "finite",
        "sampling_params.temperature",
    ),
    ("seed over 64 bits", "/v1/completions", {**COMPLETION, "seed": 2**70}, 400, "at most", "seed"),
    ("chat seed over 64 bits", "/v1/chat/completions", {**CHAT, "seed": 2**70}, 400, "at most", "seed"),
    (
        "/generate seed over 64 bits",
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"seed": 2**70, "max_tokens": 2}},
        400,
        "at most",
        "sampling_params.seed",
    ),
    (
        "/generate n over the cap",
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"n": 129, "max_tokens": 1}},
        400,
        "at most 128",
        "sampling_params.n",
    ),
    # text that is not valid Unicode: 400 naming where
    (
        "unpaired surrogate in prompt",
        "/v1/completions",
        b'{"model": "tiny", "prompt": "Hi \\ud800 there", "max_tokens": 2}',
        400,
        "not valid Unicode",
        "prompt",
    ),
    (
        "unpaired surrogate in a message",
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "x\\udc00"}], "max_tokens": 2}',
        400,
        "U+DC00",
        "messages[0].content",
    ),
    (
        "unpaired surrogate in /generate text",
        "/generate",
        b'{"text": "a\\ud83d", "sampling_params": {"max_tokens": 2}}',
        400,
        "not valid Unicode",
        "text",
    ),
    (
        "unpaired surrogate in a stop string",
        "/v1/completions",
        b'{"model": "tiny", "prompt": "Hello", "max_tokens": 2, "stop": ["ok", "\\udfff"]}',
        400,
        "not valid Unicode",
        "stop[1]",
    ),
    # max_tokens over the context: refused on every endpoint, never clipped
    (
        "max_tokens over the context",
        "/v1/completions",
        {**COMPLETION, "max_tokens": 100_000},
        400,
        "maximum context length",
        "max_tokens",
    ),
    (
        "chat max_tokens over the context",
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 100_000},
        400,
        "maximum context length",
        "max_tokens",
    ),
    (
        "/generate max_tokens over the context",
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 100_000}},
        400,
        "maximum context length",
        "max_tokens",
    ),
    ("unknown chat model", "/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "does not exist", "model"),
]


@pytest.mark.parametrize("name,path,body,status,needle,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_then_keeps_serving(server, name, path, body, status, needle, param):
    r = post(server, path, content=body) if isinstance(body, bytes) else post(server, path, body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert needle in err["message"], err
    if param is not None:
        assert err["param"] == param, err
    if status == 404:
        assert err["code"] == "model_not_found"
    ok_request(server)


def test_accepts_openai_fields_it_does_not_implement(server):
    body = {
        **CHAT,
        "user": "u1",
        "metadata": {"a": "b"},
        "store": False,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "logit_bias": {},
        "parallel_tool_calls": False,
        "service_tier": "auto",
        "response_format": {"type": "text"},
        "stream_options": None,
        "reasoning_effort": None,
        "prompt_cache_key": "k",
        "safety_identifier": "s",
    }
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    r = post(
        server, "/v1/completions", {**COMPLETION, "best_of": 1, "echo": False, "suffix": None, "user": "u"}
    )
    assert r.status_code == 200, r.text


def test_oversize_prompt_names_the_limit(server):
    models = httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    limit = models["data"][0]["max_model_len"]
    r = post(server, "/v1/completions", {**COMPLETION, "prompt": [1] * (limit + 10)})
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert str(limit) in err["message"] and err["code"] == "context_length_exceeded", err
    long_chat = {**CHAT, "messages": [{"role": "user", "content": "word " * (limit + 10)}]}
    r = post(server, "/v1/chat/completions", long_chat)
    assert r.status_code == 400 and str(limit) in error_of(r)["message"], r.text
    ok_request(server)


def test_context_errors_have_their_code_on_every_endpoint(server):
    for path, body in (
        ("/v1/completions", {**COMPLETION, "max_tokens": 5000}),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 5000}),
        ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_tokens": 5000}}),
    ):
        err = error_of(post(server, path, body))
        assert err["code"] == "context_length_exceeded" and "lower max_tokens to at most" in err["message"], (
            err
        )


def test_request_body_over_the_cap_gets_413_naming_it(server):
    big = {**COMPLETION, "prompt": "x" * (MAX_BODY + 10)}
    r = post(server, "/v1/completions", big)
    assert r.status_code == 413, r.text
    err = error_of(r)
    assert str(MAX_BODY) in err["message"] and err["code"] == "request_too_large", err

    def chunks():  # no Content-Length: the cap is counted as the body arrives
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    r = httpx.post(
        f"{server.base_url}/v1/completions",
        content=chunks(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and str(MAX_BODY) in error_of(r)["message"], r.text
    ok_request(server)


def test_api_key(server):
    r = post(server, "/v1/completions", COMPLETION, key=None)
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    assert "missing API key" in error_of(r)["message"]
    r = post(server, "/v1/completions", COMPLETION, key="sk-wrong")
    assert r.status_code == 401 and "incorrect API key" in error_of(r)["message"]
    assert httpx.get(f"{server.base_url}/v1/models").status_code == 401
    # health and metrics are exempt by default
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/metrics").status_code == 200
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)
    assert (
        good.completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices[0].finish_reason == "length"
    )


def test_unknown_route_and_method(server):
    h = {"Authorization": f"Bearer {KEY}"}
    r = httpx.get(f"{server.base_url}/v1/nothing", headers=h)
    assert r.status_code == 404 and error_of(r)["type"] == "invalid_request_error"
    r = httpx.get(f"{server.base_url}/v1/completions", headers=h)
    assert r.status_code == 405
    ok_request(server)


def test_waiting_queue_bound_gives_503_with_retry_after(server):
    """--max-num-seqs 1 --max-waiting 1: one request decodes, one waits, the third is turned away."""
    h = {"Authorization": f"Bearer {KEY}"}
    long = {"model": MODEL, "prompt": "Hello", "max_tokens": 1500, "ignore_eos": True, "stream": True}

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.base_url, headers=h, timeout=120) as c:
            async with c.stream("POST", "/v1/completions", json=long) as first:
                assert first.status_code == 200
                lines = first.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                waiting = asyncio.create_task(c.post("/v1/completions", json={**long, "stream": False}))
                for _ in range(100):  # until the second request is admitted and waiting
                    m = (await c.get("/metrics")).text
                    if "vriksha_server_requests_waiting 1.0" in m:
                        break
                    await asyncio.sleep(0.05)
                rejected = await c.post("/v1/completions", json=COMPLETION)
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            return rejected

    r = asyncio.run(run())
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    err = error_of(r)
    assert "--max-waiting=1" in err["message"] and err["code"] == "server_overloaded"
    for _ in range(50):  # the dropped requests are aborted, and the server serves again
        m = httpx.get(f"{server.base_url}/metrics").text
        if "vriksha_server_requests_in_flight 0.0" in m:
            break
        asyncio.run(asyncio.sleep(0.1))
    ok_request(server)
