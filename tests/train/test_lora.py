"""LoRA in the trainer, in one process: the config section, which layers get adapters, what trains, the
tensor-parallel plan, and the engine module kept at base + adapter (merged, then restored bit for bit)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha.errors import ConfigError
from vriksha.train.config import LoraSection, TrainConfig, load_config
from vriksha.train.lora import (
    AdapterSync,
    apply_lora,
    check_lora_parallel,
    gather_adapter,
    lora_layers,
    lora_targets,
    lora_tp_plan,
)
from vriksha.train.parallelize import tp_plan

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def tok():
    return embedded_tokenizer()


def test_config_section_defaults_to_full_fine_tuning_and_checks_values():
    assert TrainConfig().model.lora.rank == 0 and not TrainConfig().model.lora.enabled
    cfg = load_config(None, ["model.lora.rank=16", "model.lora.target_modules=[q_proj, v_proj]"])
    assert cfg.model.lora.enabled and cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    for bad, field in (
        ("model.lora.rank=-1", "model.lora.rank"),
        ("model.lora.dropout=1.0", "model.lora.dropout"),
        ("model.lora.lr=0", "model.lora.lr"),
        ("model.lora.init=pissa", "model.lora.init"),
        ("model.lora.target_modules=[]", "model.lora.target_modules"),
        ("model.lora.ranks=4", "model.lora.ranks: unknown option"),
    ):
        with pytest.raises(ConfigError, match=field):
            load_config(None, [bad])


def test_default_targets_are_the_decoders_linear_layers(tok):
    model = tiny_llama(tok, tie_word_embeddings=False)
    targets = lora_targets(model, None)
    assert len(targets) == 2 * len(PROJ) and "lm_head" not in targets
    assert {t.rsplit(".", 1)[-1] for t in targets} == set(PROJ)
    assert lora_targets(model, ["v_proj", "model.layers.1.mlp.down_proj"]) == [
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.self_attn.v_proj",
        "model.layers.1.mlp.down_proj",
    ]
    with pytest.raises(ConfigError, match=r"'c_attn' names no linear layer.*down_proj, gate_proj"):
        lora_targets(model, ["c_attn"])


def test_only_the_adapters_train_and_step_zero_is_the_base_model(tok):
    base = tiny_llama(tok).eval()
    model = copy.deepcopy(base)
    targets = apply_lora(model, LoraSection(rank=4, alpha=8.0), seed=3)
    assert sorted(lora_layers(model)) == sorted(targets)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    ids = torch.tensor([[1, 42, 7, 99, 314]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)  # B starts at zero
    again = copy.deepcopy(base)
    apply_lora(again, LoraSection(rank=4, alpha=8.0), seed=3)  # every rank draws the same A
    a = gather_adapter(model, "x", LoraSection(rank=4), None)
    b = gather_adapter(again, "x", LoraSection(rank=4), None)
    assert all(torch.equal(a.modules[n].a, b.modules[n].a) for n in a.modules)
    assert any(a.modules[n].a.abs().sum() > 0 for n in a.modules)


def test_tensor_parallel_plan_splits_each_adapter_like_its_base(tok):
    model = tiny_llama(tok)
    apply_lora(model, LoraSection(rank=4), seed=0)
    plan = lora_tp_plan(model, tp_plan(model))
    q, o = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"
    assert q not in plan and isinstance(plan[f"{q}.base_layer"], ColwiseParallel)
    assert isinstance(plan[f"{q}.lora_B.default"], ColwiseParallel) and f"{q}.lora_A.default" not in plan
    assert isinstance(plan[f"{o}.base_layer"], RowwiseParallel)
    assert isinstance(plan[f"{o}.lora_A.default"], RowwiseParallel) and f"{o}.lora_B.default" not in plan
    for name in plan:
        model.get_submodule(name)  # every entry names a real module
    with pytest.raises(ConfigError, match="model.lora.dropout"):
        check_lora_parallel(LoraSection(rank=4, dropout=0.1), tp=2)


def _train_a_little(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B["default"].weight.normal_(std=0.3)


def test_engine_module_aliases_the_base_merges_and_releases_bit_for_bit(tok):
    policy = tiny_llama(tok).eval()
    engine = copy.deepcopy(policy)
    cfg = LoraSection(rank=4, alpha=8.0)
    apply_lora(policy, cfg, seed=0)
    _train_a_little(policy)
    sync = AdapterSync(policy, engine, 1, cfg, name="run", base_model=None, merge=True)
    assert sync.aliased
    q = policy.model.layers[0].self_attn.q_proj.base_layer.weight
    assert engine.model.layers[0].self_attn.q_proj.weight.data_ptr() == q.data_ptr()  # no copy of the base
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    ids = torch.tensor([[1, 42, 7, 99, 314, 2718]])
    with torch.no_grad():
        want = policy(input_ids=ids).logits  # base + adapter through PEFT's layers
    sync.sync()
    with torch.no_grad():
        got = engine(input_ids=ids).logits  # the merged plain module the engine runs
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sync.release() is True  # before the update: the policy's base is its own again
    for n, p in policy.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p.view(torch.int32), base[n].view(torch.int32)), n
    assert sync.release() is False
