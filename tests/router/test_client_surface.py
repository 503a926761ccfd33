"""What the clients that users point at a vLLM-style server ask of `vriksha serve` and of `vriksha router` in
front of it: guidellm's benchmark (which always sends vLLM's `stream_options.continuous_usage_stats`), the
openai SDK's prompt scoring (`echo` with `max_tokens: 0`) and its embeddings call, vLLM's info endpoints
(/version, /ping, /tokenizer_info) and the model and tokenizer endpoints through the router; and what both
say at the default log level as they start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.router.conftest import Proc, free_port, wait_until
from vriksha.net.launch import vriksha_command

pytestmark = pytest.mark.slow

MODEL = "tiny"


@pytest.fixture(scope="module")
def stack(router_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One `vriksha serve` and a `vriksha router` in front of it, both started without --log-level."""
    logs = tmp_path_factory.mktemp("surface-logs")
    port = free_port()
    server_cmd = vriksha_command("serve", "--model", str(router_model_dir), "--port", str(port))
    server_cmd += ["--served-model-name", MODEL, "--kv-cache-memory-gb", "0.05"]
    server = Proc(server_cmd, logs / "serve.log", f"http://127.0.0.1:{port}/health", "server")
    server.url = f"http://127.0.0.1:{port}"
    router_port = free_port()
    router_cmd = vriksha_command("router", "--model", str(router_model_dir), "--port", str(router_port))
    router_cmd += ["--replica", server.url, "--health-interval", "0.3"]
    router = Proc(router_cmd, logs / "router.log", f"http://127.0.0.1:{router_port}/health", "router")
    router.url = f"http://127.0.0.1:{router_port}"
    try:
        server.start()
        router.start()
        yield {"serve": server, "router": router}
    finally:
        router.stop()
        server.stop()


@pytest.fixture(params=["serve", "router"])
def base(request, stack) -> str:
    return stack[request.param].url


def _log(proc: Proc, waiting_for: str = "ready on") -> str:
    """The process's log, once it holds `waiting_for` (written as the server starts to accept connections)."""

    def text() -> str | None:
        content = Path(proc.log_path).read_text()
        return content if waiting_for in content else None

    return wait_until(text, 10, waiting_for)


def test_serve_says_what_it_serves_where_and_when_it_is_ready(stack):
    server = stack["serve"]
    text = _log(server)
    port = server.url.rpartition(":")[2]
    assert re.search(r"INFO .*engine: .*dtype float32 .*KV pool \d+ tokens; quantization", text), text
    assert "INFO vriksha.engine.async_engine: engine threads:" in text, text
    assert f"ready on http://127.0.0.1:{port}: serving {MODEL} " in text, text
    assert text.index("engine threads") < text.index("ready on")


def test_router_says_where_it_listens_and_its_replicas(stack):
    router, server = stack["router"], stack["serve"]
    text = _log(router)
    port = router.url.rpartition(":")[2]
    assert re.search(
        rf"routing over 1 replicas with the \w+ policy: {re.escape(server.url)} \(both\)", text
    ), text
    assert f"ready on http://127.0.0.1:{port}: routing to {server.url}" in text, text


def _guidellm(base: str, tokenizer: Path, out: Path, request_format: str) -> dict:
    exe = Path(sys.executable).with_name("guidellm")
    cmd = [
        str(exe), "run",
        "--backend", f"kind=openai_http,target={base},model={MODEL},request_format={request_format}",
        "--profile", "kind=synchronous",
        "--constraint", "kind=max_requests,count=3",
        "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=8",
        "--tokenizer", f"kind=hf_auto,model={tokenizer}",
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())["benchmarks"][0]["requests"]


@pytest.mark.parametrize(
    ("target", "request_format"),
    [("serve", "/v1/chat/completions"), ("serve", "/v1/completions"), ("router", "/v1/chat/completions")],
)
def test_guidellm_benchmarks_serve_and_router(stack, router_model_dir, tmp_path, target, request_format):
    if not Path(sys.executable).with_name("guidellm").exists():
        pytest.skip("guidellm is not installed (the test extra installs it)")
    requests = _guidellm(stack[target].url, router_model_dir, tmp_path / "guidellm.json", request_format)
    assert len(requests["successful"]) == 3 and not requests["errored"], requests["errored"]
    for r in requests["successful"]:
        assert json.loads(r["request_args"])["body"]["stream_options"]["continuous_usage_stats"] is True
        assert r["output_tokens"] == 8 and r["prompt_tokens"] > 0


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(base):
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120) as client:
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=5,
                extra_body={"ignore_eos": True},
                stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True},
            )
        )
        plain = list(
            client.completions.create(
                model=MODEL, prompt="Hi", max_tokens=5, stream=True, stream_options={"include_usage": True}
            )
        )
    assert all(c.usage is not None for c in chunks)
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion[0] == 0 and completion == sorted(completion) and completion[-1] == 5
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    # without it, only the last chunk carries usage (OpenAI's include_usage)
    assert [c.usage is not None for c in plain] == [False] * (len(plain) - 1) + [True]


def test_echo_with_max_tokens_zero_scores_the_prompt(base):
    prompt = "The capital of France is Paris"
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120) as client:
        scored = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=0)
        generated = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=1)
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)
    choice = scored.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    n = scored.usage.prompt_tokens
    assert scored.usage.completion_tokens == 0 and len(choice.logprobs.tokens) == n
    assert choice.logprobs.token_logprobs[0] is None
    # the prompt's log-probs are those of a request that generates one token after it
    assert choice.logprobs.token_logprobs == generated.choices[0].logprobs.token_logprobs[:n]
    assert "echo=true" in str(refused.value) and refused.value.body["param"] == "max_tokens"


def test_embeddings_are_refused_by_name(base):
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL, input="hello")
    assert "embeddings are not served by this model server" in refused.value.message
    assert refused.value.code == "model_not_supported"


def test_info_endpoints(base):
    version = httpx.get(f"{base}/version", timeout=10)
    assert version.status_code == 200 and version.json()["version"]
    assert httpx.get(f"{base}/ping", timeout=10).status_code == 200
    assert httpx.post(f"{base}/ping", timeout=10).status_code == 200
    info = httpx.get(f"{base}/tokenizer_info", timeout=10)
    assert info.status_code == 200, info.text
    body = info.json()
    assert body["tokenizer_class"] and "{%" in body["chat_template"] and body["name_or_path"] == MODEL
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(body)


def test_model_and_tokenizer_endpoints_through_the_router(stack):
    server, router = stack["serve"].url, stack["router"].url
    for path in (f"/v1/models/{MODEL}", "/v1/models/nope"):
        direct, routed = httpx.get(server + path, timeout=10), httpx.get(router + path, timeout=10)
        assert routed.status_code == direct.status_code, routed.text
        assert routed.json().keys() == direct.json().keys()
    tokens = httpx.post(f"{router}/tokenize", json={"prompt": "Hello there"}, timeout=10)
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    assert (
        ids == httpx.post(f"{server}/tokenize", json={"prompt": "Hello there"}, timeout=10).json()["tokens"]
    )
    text = httpx.post(f"{router}/detokenize", json={"tokens": ids}, timeout=10)
    assert text.status_code == 200 and "Hello there" in text.json()["prompt"]
