"""The adapter record and PEFT's directory format: what vriksha writes PEFT reads unchanged (logits equal), what
PEFT writes vriksha reads, and every malformed adapter is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tiny_llama import tiny_llama
from vriksha.lora import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    LoraAdapter,
    LoraWeights,
    load_peft_dir,
    peft_key,
    save_peft_dir,
)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _linear_shapes(model) -> dict[str, tuple[int, int]]:
    return {n: tuple(m.weight.shape) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def _random_adapter(model, rank: int = 4, alpha: float = 8.0, seed: int = 1) -> LoraAdapter:
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for name, (out_f, in_f) in _linear_shapes(model).items():
        if name.rsplit(".", 1)[-1] in TARGETS:
            a = torch.randn(rank, in_f, generator=g) * 0.1
            b = torch.randn(out_f, rank, generator=g) * 0.1
            modules[name] = LoraWeights(a, b)
    return LoraAdapter("demo", rank, alpha, TARGETS, modules)


def _ids(tok):
    return torch.tensor([tok("The capital of France is Paris, and 7 + 5 = 12.")["input_ids"]])


def test_peft_loads_what_vriksha_writes_with_equal_logits(tok, tmp_path):
    from peft import PeftModel

    base = tiny_llama(tok)
    adapter = _random_adapter(base)
    save_peft_dir(adapter, tmp_path / "demo")
    config = json.loads((tmp_path / "demo" / CONFIG_FILE).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    peft_model = PeftModel.from_pretrained(tiny_llama(tok), str(tmp_path / "demo")).eval()
    # the same layers by hand: W + scaling * B A merged into a copy of the base
    merged = tiny_llama(tok).eval()
    with torch.no_grad():
        for name, module in merged.named_modules():
            if name in adapter.modules:
                module.weight += adapter.delta(name)
        ids = _ids(tok)
        got = peft_model(input_ids=ids).logits
        want = merged(input_ids=ids).logits
        plain = base.eval()(input_ids=ids).logits
    assert not torch.allclose(got, plain, atol=1e-3)  # the adapter changes the output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_vriksha_reads_what_peft_writes(tok, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_llama(tok), LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], use_rslora=True)
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    model.save_pretrained(tmp_path / "peft")
    adapter = load_peft_dir(tmp_path / "peft")
    assert adapter.name == "peft" and adapter.rank == 8 and adapter.use_rslora
    assert adapter.scaling == pytest.approx(32 / 8**0.5)
    assert sorted(adapter.modules) == sorted(
        f"model.layers.{i}.self_attn.{m}" for i in range(2) for m in ("q_proj", "v_proj")
    )
    q = model.base_model.model.model.layers[1].self_attn.q_proj
    got = adapter.modules["model.layers.1.self_attn.q_proj"]
    assert torch.equal(got.a, q.lora_A["default"].weight) and torch.equal(got.b, q.lora_B["default"].weight)
    torch.testing.assert_close(
        adapter.delta("model.layers.1.self_attn.q_proj"), q.get_delta_weight("default")
    )
    adapter.check_base(_linear_shapes(tiny_llama(tok)))


def test_round_trip_keeps_every_tensor_and_field(tok, tmp_path):
    adapter = _random_adapter(tiny_llama(tok), rank=2, alpha=3.5)
    adapter.dropout, adapter.base_model = 0.05, "HuggingFaceTB/SmolLM2-135M-Instruct"
    back = load_peft_dir(save_peft_dir(adapter, tmp_path / "a"), name="renamed")
    assert (back.name, back.rank, back.alpha, back.dropout, back.base_model) == (
        "renamed",
        2,
        3.5,
        0.05,
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    assert sorted(back.target_modules) == sorted(TARGETS)
    assert sorted(back.modules) == sorted(adapter.modules)
    for name, w in adapter.modules.items():
        assert torch.equal(back.modules[name].a, w.a) and torch.equal(back.modules[name].b, w.b)
    assert back.nbytes == adapter.nbytes


def _write(path, config=None, tensors=None):
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / CONFIG_FILE).write_text(config if isinstance(config, str) else json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(path / WEIGHTS_FILE))
    return path


GOOD = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
Q = "model.layers.0.self_attn.q_proj"


def _ab(rank=2, in_f=64, out_f=64):
    return {peft_key(Q, "A"): torch.zeros(rank, in_f), peft_key(Q, "B"): torch.zeros(out_f, rank)}


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        (None, _ab(), "no adapter_config.json"),
        ("{not json", _ab(), "cannot be read as JSON"),
        ({**GOOD, "peft_type": "IA3"}, _ab(), "only LoRA adapters"),
        ({**GOOD, "use_dora": True}, _ab(), "DoRA"),
        ({**GOOD, "bias": "all"}, _ab(), "bias"),
        ({**GOOD, "modules_to_save": ["lm_head"]}, _ab(), "modules_to_save"),
        ({**GOOD, "rank_pattern": {"q_proj": 4}}, _ab(), "rank_pattern"),
        ({**GOOD, "r": "2"}, _ab(), "r must be a number"),
        (GOOD, None, "no adapter_model.safetensors"),
        (GOOD, {peft_key(Q, "A"): torch.zeros(2, 64)}, "lora_B.weight is missing"),
        (GOOD, _ab(rank=3), "the rank (r) is 2"),
        (GOOD, {**_ab(), "base_model.model.lm_head.weight": torch.zeros(4, 4)}, "not a LoRA weight"),
        (
            GOOD,
            {**_ab(), "base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(2, 4)},
            "not a LoRA",
        ),
        (
            GOOD,
            {peft_key(Q, "A"): torch.full((2, 64), float("nan")), peft_key(Q, "B"): torch.zeros(64, 2)},
            "NaN",
        ),
        (
            GOOD,
            {peft_key(Q, "A"): torch.zeros(2, 64, dtype=torch.int32), peft_key(Q, "B"): torch.zeros(64, 2)},
            "float",
        ),
    ],
)
def test_malformed_adapters_are_refused_by_name(tmp_path, config, tensors, message):
    path = _write(tmp_path / "bad", config, tensors)
    with pytest.raises(AdapterError) as info:
        load_peft_dir(path)
    assert message in str(info.value)


def test_legacy_bin_and_torn_files_are_named(tmp_path):
    path = _write(tmp_path / "legacy", GOOD)
    (path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(AdapterError, match="older pickle format"):
        load_peft_dir(path)
    (path / WEIGHTS_FILE).write_bytes(b'\x08\x00\x00\x00\x00\x00\x00\x00{"a":1}')
    with pytest.raises(AdapterError, match="cannot be read as safetensors"):
        load_peft_dir(path)
    with pytest.raises(AdapterError, match="not a directory"):
        load_peft_dir(tmp_path / "missing")


def test_base_shapes_are_checked(tok):
    base = tiny_llama(tok)
    adapter = _random_adapter(base)
    other = _linear_shapes(tiny_llama(tok, intermediate_size=96))
    with pytest.raises(AdapterError, match=r"mlp.gate_proj is \[128 x 64\] in the adapter but \[96 x 64\]"):
        adapter.check_base(other)
    adapter.modules["model.layers.5.self_attn.q_proj"] = adapter.modules[Q]
    with pytest.raises(AdapterError, match="not a linear layer of the base model"):
        adapter.check_base(_linear_shapes(base))
