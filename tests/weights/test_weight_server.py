"""Weight updates into a real `vriksha serve` on loopback, over each data plane: every parameter ends
bit-equal to the trainer's, greedy output equals a colocated engine on the same weights, every output says
its weight version, the prefix cache never serves KV of old weights, and one trainer owns the updates."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from tests.server.conftest import WEIGHTS
from vriksha.weights import WeightSyncClient, WeightTransferError, digest
from vriksha.weights.shm import shm_available

PROMPT = [1, 42, 7, 99, 314, 2718, 5, 11, 13, 17, 19, 23]


def _trainer_model(model_dir, seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _generate(url: str, ids: list[int]) -> dict:
    r = httpx.post(
        f"{url}/generate",
        json={"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 12}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def _colocated_greedy(model, model_dir, ids: list[int]) -> list[int]:
    from vriksha.engine.llm import LLM
    from vriksha.engine.sampling_params import SamplingParams
    from vriksha.loading import load_tokenizer

    llm = LLM.from_module(model, load_tokenizer(model_dir), kv_cache_memory_gb=0.05, max_model_len=512)
    out = llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )
    return list(out[0].outputs[0].token_ids)


BACKENDS = [
    pytest.param("shm", marks=pytest.mark.skipif(not shm_available(), reason="no /dev/shm")),
    "gloo",
    "fs",
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_is_bit_equal_versioned_and_matches_colocated(
    backend, weight_server, tiny_model_dir, tmp_path
):
    url = weight_server.base_url
    before = _generate(url, PROMPT)
    again = _generate(url, PROMPT)
    assert again["cached_tokens"] > 0  # the prompt is in the prefix cache now
    v0 = before["weight_version"]
    model = _trainer_model(tiny_model_dir, seed=len(backend))
    client = WeightSyncClient(url, "trainer-a", backend=backend, bucket_bytes=1 << 16, fs_root=tmp_path)
    try:
        result = client.push(model, version=v0 + 1)
        assert result.backend == backend and result.version == v0 + 1
        nbytes = sum(p.nbytes for p in model.parameters())
        # one model-sized copy per side (the filesystem receiver may add one per unaligned tensor)
        assert result.sender["bytes_copied"] == nbytes
        assert nbytes <= result.receiver["bytes_copied"] <= (nbytes if backend != "fs" else 2 * nbytes)
        assert client.version() == v0 + 1
        served = client.digests()
        mine = {n: digest(p) for n, p in model.named_parameters()}
        assert served == mine
        after = _generate(url, PROMPT)
        assert after["weight_version"] == v0 + 1
        assert after["cached_tokens"] == 0  # KV computed under the old weights is gone
        assert after["outputs"][0]["token_ids"] == _colocated_greedy(model, tiny_model_dir, PROMPT)
        # a second push of the same weights under the next version keeps everything equal
        client.push(model, version=v0 + 2)
        assert client.digests() == mine and _generate(url, PROMPT)["weight_version"] == v0 + 2
    finally:
        client.close()


def test_second_trainer_is_refused_until_the_first_closes(weight_server, tiny_model_dir):
    url = weight_server.base_url
    a = WeightSyncClient(url, "trainer-a", backend="gloo")
    b = WeightSyncClient(url, "trainer-b", backend="gloo")
    try:
        a.connect()
        with pytest.raises(WeightTransferError, match="belong to client 'trainer-a'"):
            b.connect()
        body = {"client_id": "trainer-b", "token": "guessed", "version": 9}
        r = httpx.post(f"{url}/start_weight_update", json=body, headers=WEIGHTS, timeout=30)
        assert r.status_code == 409
        a.close()
        b.push(_trainer_model(tiny_model_dir, seed=5), version=50)
        assert b.version() == 50
    finally:
        a.close()
        b.close()


def test_mismatched_model_is_refused_by_name(weight_server, tiny_model_dir):
    model = _trainer_model(tiny_model_dir, seed=1)
    with torch.no_grad():
        model.model.norm.weight = torch.nn.Parameter(torch.ones(65))
    client = WeightSyncClient(weight_server.base_url, "trainer-a", backend="gloo")
    try:
        with pytest.raises(WeightTransferError, match="model.norm.weight"):
            client.push(model, version=77)
        assert client.version() != 77
    finally:
        client.close()


def test_pause_holds_generation_until_resume(weight_server):
    url = weight_server.base_url
    assert httpx.post(f"{url}/pause", headers=WEIGHTS, timeout=10).json() == {"paused": True}
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("out", _generate(url, PROMPT[:4])))
    t.start()
    time.sleep(1.5)
    assert "out" not in box and httpx.get(f"{url}/weight_version", timeout=10).json()["paused"] is True
    httpx.post(f"{url}/resume", headers=WEIGHTS, timeout=10)
    t.join(60)
    assert box["out"]["outputs"][0]["token_ids"]
    assert httpx.post(f"{url}/reset_prefix_cache", headers=WEIGHTS, timeout=10).json() == {"reset": True}
