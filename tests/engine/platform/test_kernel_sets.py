"""The kernel-set registry: which sets run where, how `--kernels` picks one, and a set added by a user."""

from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.config import EngineConfig
from vriksha.engine.platform import kernel_sets
from vriksha.engine.platform.native import isa
from vriksha.errors import ConfigError

HOST = torch.empty(0).device  # the device of a tensor made without one


def test_available_sets_per_device_and_dtype():
    fp32 = kernel_sets.available(HOST, torch.float32)
    assert fp32[0] == "native" and fp32[-1] == "torch"
    assert f"native-{isa.best_variant().name}" in fp32
    assert all(f"native-{v.name}" not in fp32 for v in isa.VARIANTS if not isa.runnable(v))
    assert kernel_sets.available(HOST, torch.bfloat16)[0] == "native"
    assert kernel_sets.available(HOST, torch.float16) == ["torch"]
    assert kernel_sets.available("meta", torch.float32) == ["torch"]
    assert kernel_sets.available(HOST, torch.float32, include_native=False) == ["torch"]


def test_select_resolves_auto_names_and_refuses_what_cannot_run():
    auto = kernel_sets.select("auto", HOST, torch.float32)
    assert isinstance(auto, kernel_sets.NativeKernels) and auto.lib.variant == isa.best_variant()
    assert kernel_sets.select("auto", HOST, torch.float16).name == "torch"
    assert kernel_sets.select("auto", HOST, torch.float32, include_native=False).name == "torch"
    assert kernel_sets.select("native-generic", HOST, torch.float32).lib.variant.name == "generic"
    with pytest.raises(ConfigError, match="unknown kernel set 'nope'.*torch"):
        kernel_sets.select("nope", HOST, torch.float32)
    with pytest.raises(ConfigError, match="does not run torch.float16"):
        kernel_sets.select("native", HOST, torch.float16)
    with pytest.raises(ConfigError, match="native kernels are off"):
        kernel_sets.select("native", HOST, torch.float32, include_native=False)
    missing = [v for v in isa.VARIANTS if not isa.runnable(v)]
    if missing:
        with pytest.raises(ConfigError, match="does not run"):
            kernel_sets.select(f"native-{missing[0].name}", HOST, torch.float32)


def test_kernels_flag_reaches_the_config():
    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    args = parser.parse_args(["--kernels", "torch", "--kernel-layers", "RMSNorm=/x"])
    config = EngineConfig.from_args(args)
    assert (config.platform.kernels, config.platform.kernel_layers) == ("torch", "RMSNorm=/x")
    assert EngineConfig().platform.kernels == "auto"


class CountingKernels(kernel_sets.TorchKernels):
    """A user's set: torch's ops, with SiLU gating of its own (counted)."""

    name = "counting"
    calls = 0

    def silu_mul(self, gate, up):
        CountingKernels.calls += 1
        return gate * torch.sigmoid(gate) * up


@pytest.fixture
def counting_set():
    kernel_sets.register(
        kernel_sets.KernelSetSpec(
            "counting", 1000, lambda device, dtype: dtype == torch.float32, CountingKernels
        )
    )
    try:
        yield
    finally:
        kernel_sets.unregister("counting")
    assert "counting" not in kernel_sets.names()


def test_a_registered_set_is_chosen_by_auto_and_by_name(counting_set, default_tokenizer):
    assert kernel_sets.available(HOST, torch.float32)[0] == "counting"
    assert kernel_sets.available(HOST, torch.bfloat16)[0] == "native"  # it said float32 only
    model = tiny_model("llama", 512)
    prompts = [{"prompt_token_ids": [3, 1, 4, 1, 5]}, {"prompt_token_ids": [9, 2, 6]}]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    outs = {}
    for name in ("counting", "torch"):
        llm = LLM.from_module(model, default_tokenizer, kernels=name, **ENGINE_TEST_OPTIONS)
        assert llm.engine.runner.kernels.name == name
        before = CountingKernels.calls
        outs[name] = llm.generate(prompts, params)
        llm.close()
        assert (CountingKernels.calls > before) == (name == "counting")
    for a, b in zip(outs["counting"], outs["torch"], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_engine_refuses_an_unknown_set(default_tokenizer):
    with pytest.raises(ConfigError, match="unknown kernel set"):
        LLM.from_module(tiny_model("llama", 512), default_tokenizer, kernels="fastest", **ENGINE_TEST_OPTIONS)


def test_torch_set_matches_transformers_rounding_in_bf16():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.equal(kernel_sets.TorchKernels().rms_norm(x.clone(), norm), norm(x))
    gate, up = torch.randn(2, 64).to(torch.bfloat16), torch.randn(2, 64).to(torch.bfloat16)
    assert torch.equal(kernel_sets.TorchKernels().silu_mul(gate, up), F.silu(gate) * up)
