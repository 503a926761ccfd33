"""The fields SGLang-style routers add to each request: honoured where they mean something, refused where
vriksha cannot do what they ask, accepted and ignored where they change nothing."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url_model(replicas) -> tuple[str, str]:
    url = replicas[0].url
    return url, httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def test_no_stop_trim_keeps_the_stop_string(url_model) -> None:
    url, model = url_model
    base = {"model": model, "prompt": "Count: one two three", "max_tokens": 12, "temperature": 0}
    free = httpx.post(f"{url}/v1/completions", json=base, timeout=60).json()["choices"][0]["text"]
    stop = free.strip().split()[0] if free.strip() else None
    if not stop:
        pytest.skip("the tiny model produced only whitespace; no stop string to test with")
    trimmed = httpx.post(f"{url}/v1/completions", json=base | {"stop": [stop]}, timeout=60).json()
    kept = httpx.post(
        f"{url}/v1/completions", json=base | {"stop": [stop], "no_stop_trim": True}, timeout=60
    ).json()
    assert stop not in trimmed["choices"][0]["text"]
    assert kept["choices"][0]["text"].endswith(stop)


def test_return_hidden_states_true_is_refused(url_model) -> None:
    url, model = url_model
    resp = httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "x", "max_tokens": 1, "return_hidden_states": True},
        timeout=60,
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "return_hidden_states"


def test_continue_final_message_continues_the_assistant_turn(url_model) -> None:
    url, model = url_model
    msgs = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hello the"}]
    body = {"model": model, "messages": msgs, "max_tokens": 1}
    new_turn = httpx.post(f"{url}/v1/chat/completions/render", json=body, timeout=60).json()["token_ids"]
    cont = httpx.post(
        f"{url}/v1/chat/completions/render", json=body | {"continue_final_message": True}, timeout=60
    ).json()["token_ids"]
    assert len(cont) < len(new_turn)  # no end-of-turn and no new assistant header after "Hello the"
    bad = httpx.post(
        f"{url}/v1/chat/completions",
        json=body | {"messages": msgs[:1], "continue_final_message": True},
        timeout=60,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "continue_final_message"


def test_reasoning_switches_are_accepted(url_model) -> None:
    url, model = url_model
    extra = {
        "separate_reasoning": True,
        "stream_reasoning": True,
        "include_reasoning": True,
        "no_stop_trim": False,
    }
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "temperature": 0,
    }
    plain = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    routed = httpx.post(f"{url}/v1/chat/completions", json=body | extra, timeout=60)
    assert routed.status_code == 200, routed.text
    assert routed.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


def test_render_matches_the_prompt_the_engine_sees(url_model) -> None:
    url, model = url_model
    body = {"model": model, "prompt": "render me exactly", "max_tokens": 1}
    rendered = httpx.post(f"{url}/v1/completions/render", json=body, timeout=60).json()
    done = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    assert len(rendered) == 1 and len(rendered[0]["token_ids"]) == done["usage"]["prompt_tokens"]
    assert (
        httpx.post(f"{url}/v1/completions/render", json=body | {"model": "nope"}, timeout=60).status_code
        == 404
    )
