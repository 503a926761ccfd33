"""vllm-router (the vLLM project's router, from PyPI) in front of vriksha replicas: completions and chat with
the fields it adds to every request, streaming, and its kv_aware policy fed by the vLLM-format block events."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from tests.router.conftest import Proc, free_port, vllm_router_binary

pytestmark = pytest.mark.slow

BINARY = vllm_router_binary()
if BINARY is None:
    pytest.skip(
        "the vllm-router binary is not installed (pip install vllm-router; it pulls no torch)",
        allow_module_level=True,
    )

LONG = "Rivers carry silt from the mountains down to the plains, where farmers grow rice and wheat. " * 2


def start_vllm_router(replicas, log_dir, *extra: str) -> Proc:
    port = free_port()
    cmd = [BINARY, "--port", str(port), "--prometheus-port", str(free_port()), "--worker-urls"]
    cmd += [r.url for r in replicas] + list(extra)
    proc = Proc(cmd, log_dir / f"vllm-router-{port}.log", f"http://127.0.0.1:{port}/health", "vllm-router")
    proc.url = f"http://127.0.0.1:{port}"
    proc.start()
    return proc


@pytest.fixture(scope="module")
def model_name(replicas) -> str:
    return httpx.get(f"{replicas[0].url}/v1/models", timeout=10).json()["data"][0]["id"]


def test_round_robin_completions_chat_and_stream(replicas, model_name, tmp_path) -> None:
    vr = start_vllm_router(replicas, tmp_path, "--policy", "round_robin")
    try:
        for _ in range(2):  # both replicas, in turn
            resp = httpx.post(
                f"{vr.url}/v1/completions",
                json={"model": model_name, "prompt": "Hi", "max_tokens": 2},
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == 2
        chat = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        resp = httpx.post(f"{vr.url}/v1/chat/completions", json=chat, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["role"] == "assistant"
        with httpx.stream(
            "POST", f"{vr.url}/v1/chat/completions", json=chat | {"stream": True}, timeout=60
        ) as s:
            assert s.status_code == 200
            lines = [x for x in s.iter_lines() if x.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
    finally:
        vr.stop()


def test_kv_aware_follows_the_block_events(replicas, model_name, router_model_dir, tmp_path) -> None:
    sources = []
    for r in replicas:
        sources += ["--kv-event-source", f"{r.url}={r.vllm_events}"]
    vr = start_vllm_router(
        replicas, tmp_path, "--policy", "kv_aware", *sources, "--kv-event-block-size", "16",
        "--kv-event-model", str(router_model_dir),
    )  # fmt: skip
    try:
        time.sleep(1.0)  # its event subscriptions connect
        # cache the prompt on the second replica directly, past the router: only its events can tell
        body = {
            "model": model_name,
            "prompt": f"{uuid.uuid4().hex} {LONG}",
            "max_tokens": 2,
            "temperature": 0,
        }
        first = httpx.post(f"{replicas[1].url}/v1/completions", json=body, timeout=60)
        assert first.status_code == 200, first.text
        prompt_tokens = first.json()["usage"]["prompt_tokens"]
        assert prompt_tokens > 32
        time.sleep(1.0)  # the events reach the router
        cached = []
        for _ in range(3):
            resp = httpx.post(f"{vr.url}/v1/completions", json=body, timeout=60)
            assert resp.status_code == 200
            cached.append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert min(cached) >= prompt_tokens - 16, (cached, vr.log_tail())
        assert "decode batch" not in vr.log_tail(20000), vr.log_tail()
    finally:
        vr.stop()
