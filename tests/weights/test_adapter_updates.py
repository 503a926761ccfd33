"""Adapter-only weight updates into a real `vriksha serve` on loopback, over each data plane: only the adapter's
bytes move, the server then serves base + adapter (greedy tokens equal a colocated engine on the merged
weights), the adapter it holds is bit-equal to the trainer's, each new adapter replaces the last without the
base drifting, and an adapter that does not fit the served model is refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.weights.test_weight_server import BACKENDS, PROMPT, _colocated_greedy, _generate
from vriksha.lora import LoraAdapter, LoraWeights
from vriksha.weights import WeightSyncClient, WeightTransferError, digest

pytestmark = pytest.mark.slow


def _base(model_dir) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _adapter(model: torch.nn.Module, seed: int, rank: int = 4, zero: bool = False) -> LoraAdapter:
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."):
            out_f, in_f = m.weight.shape
            b = torch.zeros(out_f, rank) if zero else torch.randn(out_f, rank, generator=g) * 0.3
            modules[name] = LoraWeights(torch.randn(rank, in_f, generator=g) * 0.3, b)
    return LoraAdapter(f"a{seed}", rank, 8.0, ("q_proj", "k_proj"), modules)


def _merged(base: torch.nn.Module, adapter: LoraAdapter) -> torch.nn.Module:
    model = copy.deepcopy(base)
    with torch.no_grad():
        for name in adapter.modules:
            model.get_submodule(name).weight += adapter.delta(name)
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_adapter_updates_move_the_adapter_alone_and_serve_base_plus_adapter(
    backend, weight_server, tiny_model_dir, tmp_path
):
    url = weight_server.base_url
    base = _base(tiny_model_dir)
    client = WeightSyncClient(url, "trainer-a", backend=backend, bucket_bytes=1 << 16, fs_root=tmp_path)
    try:
        v = client.version() + 1
        client.push(base, version=v)  # the module's earlier tests may have left other weights
        base_digests = client.digests()
        for step, seed in enumerate((1, 2)):
            adapter = _adapter(base, seed)
            result = client.push_adapter(adapter, version=v + 1 + step)
            assert result.sender["bytes_copied"] == adapter.nbytes  # the adapter's bytes, not the model's
            assert result.receiver["bytes_copied"] == adapter.nbytes
            served = client.digests()
            for key, t in adapter.peft_state_dict().items():
                assert served[key] == digest(t)
            out = _generate(url, PROMPT)
            assert out["weight_version"] == v + 1 + step and out["cached_tokens"] == 0
            assert out["outputs"][0]["token_ids"] == _colocated_greedy(
                _merged(base, adapter), tiny_model_dir, PROMPT
            )
        # an adapter of zeros after two others: the served weights are the base again, bit for bit
        client.push_adapter(_adapter(base, 3, zero=True), version=v + 3)
        served = client.digests()
        assert {n: served[n] for n in base_digests} == base_digests
    finally:
        client.close()


def test_an_adapter_that_does_not_fit_is_refused_by_name(weight_server, tiny_model_dir):
    base = _base(tiny_model_dir)
    client = WeightSyncClient(weight_server.base_url, "trainer-a", backend="gloo")
    try:
        before = client.version()
        stray = _adapter(base, 4)
        stray.modules["model.layers.7.self_attn.q_proj"] = stray.modules["model.layers.0.self_attn.q_proj"]
        with pytest.raises(
            WeightTransferError, match="'model.layers.7.self_attn.q_proj', which is not a linear"
        ):
            client.push_adapter(stray, version=before + 1)
        wide = _adapter(base, 5)
        q = wide.modules["model.layers.0.self_attn.q_proj"]
        wide.modules["model.layers.0.self_attn.q_proj"] = LoraWeights(torch.zeros(4, 65), q.b)
        with pytest.raises(WeightTransferError, match=r"self_attn\.q_proj is \[64 x 65\] in the adapter"):
            client.push_adapter(wide, version=before + 1)
        assert client.version() == before
        assert _generate(weight_server.base_url, PROMPT)["weight_version"] == before  # still serving
    finally:
        client.close()
