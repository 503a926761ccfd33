"""Sessions over HTTP: `session_id` on /generate and the OpenAI routes (the openai SDK's extra_body) or the
x-session-id header pins a session's K/V, /metrics counts it, POST /close_session releases it."""

from __future__ import annotations

import httpx
import openai


def test_session_ids_pin_and_close_over_http(server_factory, tiny_model_dir):
    server = server_factory(
        ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--kv-cache-tokens", "4000"]
    )
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
        extra_body={"session_id": "episode-1"},
    )
    assert chat.choices[0].message is not None
    client.completions.create(
        model="tiny",
        prompt="one two three",
        max_tokens=3,
        temperature=0,
        extra_headers={"x-session-id": "episode-2"},
    )
    r = httpx.post(
        f"{server.base_url}/generate",
        json={
            "input_ids": list(range(100, 140)),
            "sampling_params": {"max_new_tokens": 2},
            "session_id": "episode-3",
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    m = server.metrics()
    assert m["vriksha_sessions_open"] == 3 and m["vriksha_sessions_pinned"] == 3
    pinned = m["vriksha_kv_cache_pinned_tokens"]
    assert pinned >= 42
    closed = httpx.post(
        f"{server.base_url}/close_session", json={"session_id": "episode-3"}, timeout=10
    ).json()
    assert closed == {"session_id": "episode-3", "closed": True}
    again = httpx.post(
        f"{server.base_url}/close_session", headers={"x-session-id": "episode-3"}, timeout=10
    ).json()
    assert again["closed"] is False
    m = server.metrics()
    assert (
        m["vriksha_sessions_open"] == 2 and m["vriksha_kv_cache_pinned_tokens"] == pinned - 41
    )  # its 40 prompt tokens and the first new one
    bad = httpx.post(f"{server.base_url}/close_session", json={}, timeout=10)
    assert bad.status_code == 400 and "session_id" in bad.text
    empty = httpx.post(
        f"{server.base_url}/generate", json={"input_ids": [1, 2], "session_id": ""}, timeout=10
    )
    assert empty.status_code == 400
