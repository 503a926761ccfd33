"""Decode steps with every decoder layer in one native call equal the lean forward's, and run only where they apply."""

import copy
import json

import pytest
import torch

from tests.engine.conftest import ENGINE_TEST_OPTIONS, assert_same_samples, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.config import PlatformConfig
from vriksha.engine.platform import native
from vriksha.engine.runner.lean_forward import LeanForward
from vriksha.engine.runner.native_decode import NativeDecode
from vriksha.engine.runner.native_decode_choice import synthetic_decode
from vriksha.engine.runner.step import ForwardStep
from vriksha.errors import ConfigError

pytestmark = pytest.mark.skipif(native.kernels() is None, reason="no C compiler: no native kernels")
FAMILIES = ["llama", "qwen2", "qwen3", "qwen2-sliding"]


def _pair(model, tokenizer, **options):
    on = LLM.from_module(
        copy.deepcopy(model), tokenizer, **ENGINE_TEST_OPTIONS, native_decode="on", **options
    )
    off = LLM.from_module(
        copy.deepcopy(model), tokenizer, **ENGINE_TEST_OPTIONS, native_decode="off", **options
    )
    return on, off


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", FAMILIES)
def test_one_decode_step_equals_the_lean_forward(name, kv, default_tokenizer):
    """Over an fp32 or a bf16 KV pool (kv_cache_dtype): the native step rounds K/V and the query as the lean
    forward does."""
    model = tiny_model(name, 512)
    on, _ = _pair(model, default_tokenizer, kv_cache_dtype=kv)
    runner = on.engine.runner
    assert runner.path(NativeDecode) is not None, runner.native_decode_choice
    assert runner.pool.dtype == getattr(torch, kv) and next(model.parameters()).dtype == torch.float32
    for batch in (1, 3):
        step = ForwardStep(inputs=synthetic_decode(runner.pool, runner.attention, batch, 12, 512))
        fused = runner.path(NativeDecode)(step)
        k_fused = [k.clone() for k in runner.pool.k]
        lean = runner.path(LeanForward)(step)
        assert fused.shape == lean.shape == (batch, 512)
        torch.testing.assert_close(fused, lean, rtol=1e-5, atol=1e-5)
        for a, b in zip(k_fused, runner.pool.k, strict=True):  # the same K written to the same slots
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_and_seeded_generation_unchanged(name, kv, default_tokenizer):
    vocab = 512
    model = tiny_model(name, vocab)
    on, off = _pair(model, default_tokenizer, kv_cache_dtype=kv)
    assert on.engine.runner.path(NativeDecode) is not None and off.engine.runner.path(NativeDecode) is None
    # the two forwards agree to ~1e-6 in fp32; rounded to a bf16 pool, such a difference can move a stored K/V
    # value by one bf16 step (2^-8 of it), and over 16 steps of these tiny models those steps moved a log-prob
    # by 4e-6 to 7e-3 (eight seeds, an AVX2-only EPYC; 4e-5 on an AVX-512 one, where torch's fp32 matmuls sum in
    # another order), a fifth of what the bf16 pool itself moves them (3e-2 to 6e-2 against an fp32 pool)
    assert_same_samples(on, off, vocab, seed=3, n=2, atol=1e-5 if kv == "float32" else 1e-2)
    prompts = [{"prompt_token_ids": list(range(1, 1 + k))} for k in (2, 7, 19)]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    a, b = on.generate(prompts, greedy), off.generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


def test_packed_int8_weights_take_the_packed_kernel(default_tokenizer):
    model = tiny_model("qwen2", 512)
    on, off = _pair(model, default_tokenizer, quantization="int8")
    nd = on.engine.runner.path(NativeDecode)
    assert nd is not None and nd.quant is not None
    plan = nd._plan(1)
    layers = nd._plans[0][1]
    assert plan.num_layers == len(model.model.layers)
    assert all(layers[i].q.kind == 3 and layers[i].down.kind == 3 for i in range(plan.num_layers))  # int8
    assert_same_samples(on, off, 512, seed=4, n=1, atol=1e-5)


@pytest.mark.slow
def test_embedded_model_default_prompts_greedy_unchanged():
    from tests.engine.test_parity_default import RAW

    llm = LLM(native_decode="on")
    runner = llm.engine.runner
    fused = runner.path(NativeDecode)
    assert fused is not None, runner.native_decode_choice
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = RAW[:6]
    a = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    llm.flush_cache()
    runner.paths.remove(runner.path(NativeDecode))
    b = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert a == b


@pytest.mark.slow
def test_int8_activations_run_in_the_native_step_as_in_the_lean_forward():
    """`--packed-activations int8`: the native step calls the same int8-activation kernel per bucket as the
    lean forward, so greedy outputs are the same with it and without it."""
    from tests.engine.test_parity_default import RAW
    from vriksha.engine.platform.native.quant import INT8_PATHS

    llm = LLM(quantization="gguf", packed_activations="int8", native_decode="on")
    runner = llm.engine.runner
    assert runner.path(NativeDecode) is not None, runner.native_decode_choice
    native_paths = {p for _, _, native in runner.quant.installed.values() for p in native}
    if not native_paths & set(INT8_PATHS):
        pytest.skip(f"no int8-activation path measured faster here (paths: {runner.quant.kernels.paths})")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    a = [o.outputs[0].token_ids for o in llm.generate(RAW[:4], params)]
    llm.flush_cache()
    runner.paths.remove(runner.path(NativeDecode))
    b = [o.outputs[0].token_ids for o in llm.generate(RAW[:4], params)]
    assert a == b


def test_off_switch_auto_and_fallbacks(default_tokenizer):
    model = tiny_model("llama", 512)
    auto = LLM.from_module(copy.deepcopy(model), default_tokenizer, **ENGINE_TEST_OPTIONS)
    choice = auto.engine.runner.native_decode_choice
    assert choice.startswith(("auto (measured): decode batches up to", "auto (cached): decode batches up to"))
    assert "batch 1:" in choice
    lean = LLM.from_module(copy.deepcopy(model), default_tokenizer, **ENGINE_TEST_OPTIONS, fast_forward=False)
    assert (
        lean.engine.runner.path(NativeDecode) is None
        and "Transformers forward" in lean.engine.runner.native_decode_choice
    )
    torch_set = LLM.from_module(
        copy.deepcopy(model), default_tokenizer, **ENGINE_TEST_OPTIONS, native_decode="on", kernels="torch"
    )
    assert torch_set.engine.runner.path(NativeDecode) is None
    assert "not a native one" in torch_set.engine.runner.native_decode_choice
    with pytest.raises(ConfigError, match="native_decode must be one of auto, on, off"):
        PlatformConfig(native_decode="yes")


def test_long_prefill_chunks_keep_the_lean_forward_short_ones_run_as_decode_rows(default_tokenizer):
    options = dict(ENGINE_TEST_OPTIONS, chunked_prefill_size=128, max_num_batched_tokens=128)
    on = LLM.from_module(tiny_model("qwen3", 512), default_tokenizer, **options, native_decode="on")
    runner = on.engine.runner
    calls = []
    fused = runner.path(NativeDecode)
    original = fused.__call__

    class Counting:
        def __getattr__(self, name):
            return getattr(fused, name)

        def __call__(self, step):
            calls.append(step.inputs.input_ids.shape[1])
            return original(step)

    runner.paths[runner.paths.index(fused)] = Counting()
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    on.generate([{"prompt_token_ids": list(range(1, 1 + k))} for k in (3, 30)], greedy)
    assert calls == [33] + [2] * 5  # both prompts in the first step, as decode rows, then their decodes
    calls.clear()
    on.generate([{"prompt_token_ids": list(range(100, 200))}], greedy)  # 100 rows reading 5,050 positions
    assert calls == [1] * 5  # decode tokens only: the prompt took the lean forward


def test_auto_choice_is_measured_once_then_read_from_the_cache(default_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    model = tiny_model("llama", 512)
    first = LLM.from_module(copy.deepcopy(model), default_tokenizer, **ENGINE_TEST_OPTIONS)
    assert first.engine.runner.native_decode_choice.startswith("auto (measured)")
    kept = json.loads((tmp_path / "native_decode.json").read_text())
    assert len(kept) == 1 and "batch 1:" in next(iter(kept.values()))["timings"][0]
    second = LLM.from_module(copy.deepcopy(model), default_tokenizer, **ENGINE_TEST_OPTIONS)
    assert second.engine.runner.native_decode_choice.startswith("auto (cached)")
    other = LLM.from_module(copy.deepcopy(tiny_model("qwen2", 512)), default_tokenizer, **ENGINE_TEST_OPTIONS)
    assert other.engine.runner.native_decode_choice.startswith(
        "auto (measured)"
    )  # other shapes, measured anew
