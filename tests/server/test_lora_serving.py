"""A real `vriksha serve --enable-lora` process on loopback, driven by the openai SDK: adapters from
--lora-modules and from /v1/load_lora_adapter serve PEFT + Transformers' greedy tokens, /v1/models lists them
with their parent, an unknown adapter gets a 404 naming it, and loading is behind the API key."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.lora.test_serving_engine import peft_adapter

API_KEY = "lora-test-key"
pytestmark = pytest.mark.slow


def _peft_adapter(model_dir, out, seed: int, rank: int = 4):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    return peft_adapter(base, out, seed, rank, targets=("q_proj", "v_proj", "down_proj"))


def _load(server, name: str, path) -> httpx.Response:
    body = {"lora_name": name, "lora_path": str(path)}
    return httpx.post(
        f"{server.base_url}/v1/load_lora_adapter", json=body, headers=server.headers, timeout=60
    )


def _greedy_text(model, tok, prompt: str, n: int) -> str:
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture(scope="module")
def setup(server_factory, tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("adapters")
    first = _peft_adapter(tiny_model_dir, root / "first", seed=1)
    second = _peft_adapter(tiny_model_dir, root / "second", seed=2)
    _peft_adapter(tiny_model_dir, root / "too-big", seed=3, rank=16)
    args = ["--model", str(tiny_model_dir), "--enable-lora", "--lora-modules", f"first={root / 'first'}"]
    args += ["--max-loras", "2", "--max-lora-rank", "8", "--kv-cache-memory-gb", "0.02"]
    server = server_factory(args, api_key=API_KEY)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return server, root, tok, {"first": first, "second": second, None: base}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


def _complete(client, model: str, prompt: str) -> str:
    out = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0.0)
    return out.choices[0].text


def test_adapters_serve_peft_tokens_and_are_listed_with_parent(setup):
    server, root, tok, models = setup
    client = _client(server)
    cards = {m.id: m for m in client.models.list().data}
    base_name = next(i for i in cards if i != "first")
    assert "first" in cards and cards["first"].model_extra["parent"] == base_name
    prompt = "The capital of France is"
    got_first = _complete(client, "first", prompt)
    assert got_first == _greedy_text(models["first"], tok, prompt, 6)
    assert _complete(client, base_name, prompt) == _greedy_text(models[None], tok, prompt, 6)
    assert got_first != _complete(client, base_name, prompt)
    chat = client.chat.completions.create(
        model="first", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0
    )
    assert chat.model == "first" and chat.choices[0].message.content is not None


def test_unknown_adapter_is_a_404_naming_it(setup):
    server, *_ = setup
    with pytest.raises(openai.NotFoundError, match="no-such-adapter"):
        _complete(_client(server), "no-such-adapter", "hello")


def test_load_and_unload_behind_the_api_key(setup):
    server, root, tok, models = setup
    url = server.base_url
    body = {"lora_name": "second", "lora_path": str(root / "second")}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=body, timeout=30).status_code == 401
    r = _load(server, "second", root / "second")
    assert r.status_code == 200, r.text
    client = _client(server)
    prompt = "Once upon a time"
    assert _complete(client, "second", prompt) == _greedy_text(models["second"], tok, prompt, 6)
    assert "second" in {m.id for m in client.models.list().data}
    # refused by name: a path that is no adapter, a rank over --max-lora-rank, a full --max-loras
    bad = _load(server, "x", root / "missing")
    assert bad.status_code == 400 and "missing" in bad.json()["error"]["message"]
    big = _load(server, "big", root / "too-big")
    assert big.status_code == 400 and "--max-lora-rank 8" in big.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "second"}, headers=server.headers)
    assert r.status_code == 200, r.text
    with pytest.raises(openai.NotFoundError, match="second"):
        _complete(client, "second", prompt)
    again = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "second"}, headers=server.headers)
    assert again.status_code == 404 and "second" in again.json()["error"]["message"]


def test_metrics_report_running_adapters(setup):
    server, *_ = setup
    client = _client(server)
    stream = client.completions.create(
        model="first",
        prompt="Count with me:",
        max_tokens=200,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))  # the request runs
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    stream.close()
    line = next(x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{"))
    assert 'running_lora_adapters="first"' in line and 'max_lora="2"' in line
