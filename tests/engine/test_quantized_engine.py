"""Packed weights in the engine: the embedded Q4_1 GGUF served as it is, and weight-only int8 on any model.

Tolerances (stated here, measured on the machines the tests ran on):
- GGUF packed vs the dequantized fp32 model (the same weight values; the float paths, the default, differ
  only in the order of the fp32 additions; the int16 paths, opt-in, round each activation to int16 within its
  block of 32): logits within 2e-2 absolute (logits are O(10); measured max 8e-5 on the float paths, 7.6e-3
  with the integer paths on every prefill and decode call, against 0.5 to 1.6 for a bf16 model); greedy tokens
  equal on five of the default-model parity prompts (16 tokens each).
- GGUF packed in a bf16 engine vs the fp32 model: the activations are bf16 either way, so the packed model is
  held to the dense bf16 model's own distance from fp32 (mean |delta logits| at most 1.5x, measured 0.9x).
- GGUF packed with int8 activations (`packed_activations="int8"`, each block of 32 rounded to 1/254 of its
  largest, llama.cpp's Q8 numerics) vs the dequantized fp32 model: held to the same bar, the dense bf16
  model's distance (mean |delta logits| at most 1.5x, measured 1.15x on the AVX-512 VNNI EPYC); greedy
  outputs may differ from the fp32 engine's after a few tokens, so only the answer is checked.
- int8 vs the fp32 model it was quantized from (a random tiny Llama, whose weights quantize worse than trained
  ones): |delta logits| / std(logits) under 0.03 on average and 0.2 at most (measured 0.02 and 0.12); the
  int8 engine equals an fp32 engine over the int8-dequantized weights to 1e-4 and token for token.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.installation import ModuleInstallation
from vriksha.engine.native.quant import BF16_PATHS, FLOAT_PATHS, INT8_PATHS, quant_kernels
from vriksha.engine.quant_linear import BUCKETS, QuantLinear
from vriksha.engine.quantization import packed_activations
from vriksha.errors import ConfigError
from vriksha.loading import load_model
from vriksha.loading.gguf_weights import read_gguf_linears
from vriksha.loading.loader import default_gguf_path
from vriksha.loading.packed import dequantize, quantize_int8

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Q: What is the boiling point of water?\nA:",
]
VOCAB = 256  # prompts are token ids below it
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def kernels():
    k = quant_kernels()
    if k is None:
        pytest.skip("no C compiler: the quantized kernels cannot be built")
    return k


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


@pytest.fixture(scope="module")
def packed_gguf(embedded):
    return read_gguf_linears(default_gguf_path(), tie_word_embeddings=True)


def test_gguf_blocks_dequantize_to_the_converted_weights(embedded, packed_gguf):
    """Every Q4_1/Q8_0 block, mapped to its module (q/k rows un-interleaved), is the converted fp32 weight."""
    modules = dict(embedded.model.named_modules())
    assert {w.qtype for w in packed_gguf.values()} == {"q4_1", "q8_0"}
    assert sum(w.qtype == "q4_1" for w in packed_gguf.values()) == 210
    assert packed_gguf["lm_head"].qtype == "q8_0"  # tied to the Q8_0 token embedding
    for name, w in packed_gguf.items():
        assert torch.equal(dequantize(w), modules[name].weight.detach()), name


def test_packed_logits_close_to_the_dequantized_model(embedded, packed_gguf, kernels):
    model, tok = embedded.model, embedded.tokenizer
    router = QuantLinear(model, packed_gguf, kernels)
    assert len(router.layers) == 211
    with ModuleInstallation(model) as installation, torch.inference_mode():
        router.install(installation)
        for prompt in PROMPTS:
            ids = torch.tensor([tok.encode(prompt)])
            ref = model(ids).logits
            with router.engaged():
                got = model(ids).logits
            print(f"packed vs dequantized logits: max |delta| {(got - ref).abs().max():.2e}")
            assert (got - ref).abs().max() < 2e-2
            assert not torch.equal(got, ref)  # the packed kernels really ran
    assert all("forward" not in m.__dict__ for m, _ in router.layers)  # handed back as it came


def test_gguf_engine_greedy_equals_the_fp32_engine(embedded):
    model, tok = embedded.model, embedded.tokenizer
    outs = {}
    for mode in ("none", "gguf"):
        with LLM.from_module(model, tok, model=str(default_gguf_path()), quantization=mode) as llm:
            assert llm.engine.quantization.mode == mode
            outs[mode] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert outs["gguf"] == outs["none"]


def test_packed_layers_hold_no_dense_copy_until_the_weights_change(embedded):
    """Layers the packed kernels serve at every batch size keep only their own weight (no transposed or
    oneDNN copy of it); once an update retires the GGUF blocks, the dense path serves the new weights."""
    model, tok = copy.deepcopy(embedded.model), embedded.tokenizer
    gguf = str(default_gguf_path())
    with LLM.from_module(model, tok, model=gguf, quantization="gguf") as llm:
        runner = llm.engine.runner
        assert runner.fast_linear.head is model.lm_head  # the one layer whose large buckets are extrapolated
        packed = runner.quant.always_packed()
        assert len(packed) == len(runner.quant.layers)
        assert all(lay.nbytes() == 0 for lay in runner.fast_linear.layouts if lay.linear in packed)
        llm.generate(PROMPTS[:2], GREEDY)
        assert all(lay.nbytes() == 0 for lay in runner.fast_linear.layouts if lay.linear in packed)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.down_proj.weight.mul_(0.5)
        llm.weights_updated()
        assert not runner.quant.enabled
        assert all(lay.nbytes() > 0 for lay in runner.fast_linear.layouts if lay.paths)  # made again, eagerly
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    with LLM.from_module(model, tok, model=gguf, quantization="none") as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert got == want


def test_packed_bf16_model_is_as_close_to_fp32_as_dense_bf16(embedded, packed_gguf, kernels):
    """A bf16 engine decodes from the same 4-bit blocks: bf16 activations in, fp32 sums, bf16 out."""
    bf16 = load_model(None, dtype=torch.bfloat16)
    model, tok = bf16.model, bf16.tokenizer
    router = QuantLinear(model, packed_gguf, kernels)
    assert len(router.layers) == 211  # the blocks match the bf16-rounded weights too
    dense_err, packed_err = [], []
    with ModuleInstallation(model) as installation, torch.inference_mode():
        router.install(installation)
        for prompt in PROMPTS:
            ids = torch.tensor([tok.encode(prompt)])
            ref = embedded.model(ids).logits
            dense = model(ids).logits.float()
            with router.engaged():
                got = model(ids).logits
            assert got.dtype == torch.bfloat16
            dense_err.append((dense - ref).abs().mean().item())
            packed_err.append((got.float() - ref).abs().mean().item())
            _, path = router.packed_for(router.layers[0][0], ids.shape[1])
            if path not in BF16_PATHS:  # the AMX path's bf16 weights and fp32 sums can give dense bf16's bits
                assert not torch.equal(got.float(), dense)  # the packed kernels really ran
    print(f"mean |delta logits| vs fp32: dense bf16 {dense_err}, packed bf16 {packed_err}")
    assert sum(packed_err) <= 1.5 * sum(dense_err)


def int8_path(kernels) -> str:
    paths = [p for p in kernels.paths if p in INT8_PATHS]
    if not paths:
        pytest.skip("needs avx2: the int8-activation paths are avx2_i8 and avx512_vnni_i8")
    return paths[-1]


def test_int8_activations_are_as_close_to_fp32_as_dense_bf16(embedded, packed_gguf, kernels):
    path = int8_path(kernels)
    bf16 = load_model(None, dtype=torch.bfloat16)
    model, tok = embedded.model, embedded.tokenizer
    router = QuantLinear(model, packed_gguf, kernels, activations="int8")
    n = len(BUCKETS)  # every call on the int8 path, whatever the timings would choose
    router.times = {
        router.key(w): {
            "path": [path] * n,
            "packed": [0.0] * n,
            "dense": [1.0] * n,
            "dense_native": [1.0] * n,
        }
        for _, w in router.layers
    }
    dense_err, int8_err = [], []
    with ModuleInstallation(model) as installation, torch.inference_mode():
        router.install(installation)
        assert router.activations() == "int8"
        for prompt in PROMPTS:
            ids = torch.tensor([tok.encode(prompt)])
            ref = model(ids).logits
            with router.engaged():
                got = model(ids).logits
            dense_err.append((bf16.model(ids).logits.float() - ref).abs().mean().item())
            int8_err.append((got - ref).abs().mean().item())
            assert (got - ref).abs().max() < 3.0
    print(f"mean |delta logits| vs fp32: dense bf16 {dense_err}, int8 activations {int8_err}")
    assert sum(int8_err) <= 1.5 * sum(dense_err)
    assert sum(int8_err) > 10 * 2e-3  # coarser than the int16 paths (about 1e-3): the int8 path really ran


def test_int8_activations_engine(kernels):
    """`--packed-activations int8`: timed beside the float and int16 paths under their own key, chosen where
    faster (nearly everywhere), said in the choice, and the answers stay right."""
    int8_path(kernels)
    with LLM(quantization="gguf", packed_activations="int8") as llm:
        quant = llm.engine.runner.quant
        assert quant.timings.activations == "int8" and quant.key(quant.layers[0][1]).endswith(":int8")
        routes = {p for _, route, _ in quant.installed.values() for p in route}
        assert llm.engine.quantization.activations == quant.activations()
        assert (llm.engine.quantization.activations == "int8") is bool(routes & set(INT8_PATHS))
        assert f"{llm.engine.quantization.activations} activations" in llm.engine.quantization.describe()
        out = llm.generate(PROMPTS[0], GREEDY)[0].outputs[0].text
    assert "Paris" in out


def test_packed_activations_follow_the_engines_precision():
    """`auto` keeps the activations as they are (the dequantized model's numbers) unless the engine already
    runs at a bf16 engine's precision: `dtype="fastest"` (measured) with fp32_precision auto, or
    fp32_precision bf16, where int8 may be taken; an explicit mode is taken as it is."""
    assert packed_activations("auto", "auto", dtype_measured=True) == "int8"
    assert packed_activations("auto", "bf16", dtype_measured=False) == "int8"
    assert packed_activations("auto", "auto", dtype_measured=False) == "float32"
    assert packed_activations("auto", "ieee", dtype_measured=True) == "float32"
    assert packed_activations("int16", "bf16", dtype_measured=True) == "int16"
    assert packed_activations("int8", "ieee", dtype_measured=False) == "int8"
    assert packed_activations("float32", "bf16", dtype_measured=True) == "float32"
    with pytest.raises(ConfigError, match="packed_activations must be one of auto, float32, int16, int8"):
        packed_activations("int4", "auto", dtype_measured=True)


def test_the_engine_resolves_auto_activations(kernels):
    """The engine hands the rule's answer to the packed router: by default only the float paths are timed and
    installed (the dequantized model's numbers); fp32_precision bf16 lets the same engine time and take int8."""
    int8_path(kernels)
    for precision, activations in (("auto", "float32"), ("bf16", "int8")):
        with LLM(quantization="gguf", fp32_precision=precision) as llm:
            assert llm.engine.runner.quant.timings.activations == activations
            if activations == "float32":
                assert llm.engine.quantization.activations == "float32"
                paths = {p for _, r, n in llm.engine.runner.quant.installed.values() for p in r + n} - {None}
                assert paths and paths <= set(FLOAT_PATHS)


def test_bf16_engine_serves_the_gguf_blocks(embedded):
    """`--dtype bfloat16 --quantization gguf`: the engine takes it, says so, and generates sensible text."""
    with LLM(dtype="bfloat16", quantization="gguf") as llm:
        choice = llm.engine.quantization
        assert choice.mode == "gguf" and choice.dense == "bf16"
        assert llm.engine.dtype_choice.dtype == torch.bfloat16
        assert "dtype bfloat16" in llm.engine.dtype_choice.describe()  # not the CPU flags' avx512_bf16
        out = llm.generate(PROMPTS[0], GREEDY)[0].outputs[0].text
    assert "Paris" in out


@pytest.fixture(scope="module")
def tiny(default_tokenizer):
    return tiny_model("llama", vocab_size=VOCAB, seed=3), default_tokenizer


def _int8_dequantized_copy(model):
    """An fp32 model whose linear weights are the int8 ones dequantized (a tied lm_head is untied: the
    engine's packed lm_head leaves the embedding fp32)."""
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(dequantize(quantize_int8(m.weight)), requires_grad=False)
    return twin


def test_int8_logits_close_to_fp32_on_a_tiny_llama(tiny, kernels):
    model, _ = tiny
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    packed = {n: quantize_int8(m.weight) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    twin = _int8_dequantized_copy(model)
    router = QuantLinear(model, packed, kernels)
    with ModuleInstallation(model) as installation, torch.inference_mode():
        router.install(installation)
        ref = model(ids).logits
        with router.engaged():
            got = model(ids).logits
        same_values = twin(ids).logits
    delta = (got - ref).abs() / ref.std()
    print(f"int8 vs fp32 logits, relative to their std: mean {delta.mean():.4f} max {delta.max():.4f}")
    assert delta.mean() < 0.03 and delta.max() < 0.2
    assert (got - same_values).abs().max() < 1e-4


def test_int8_engine_greedy_tokens(tiny):
    model, tok = tiny
    g = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(0, VOCAB, (k,), generator=g).tolist()} for k in (1, 7, 30)]
    with LLM.from_module(copy.deepcopy(model), tok, quantization="int8", **ENGINE_TEST_OPTIONS) as llm:
        assert llm.engine.quantization.mode == "int8"
        assert llm.engine.quantization.formats == {"int8": 15}  # 2 layers x 7 + lm_head
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    twin = _int8_dequantized_copy(model)
    with LLM.from_module(twin, tok, quantization="none", **ENGINE_TEST_OPTIONS) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want


def test_int8_follows_weight_updates(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    prompt = {"prompt_token_ids": [5, 6, 7]}
    with LLM.from_module(model, tok, quantization="int8", **ENGINE_TEST_OPTIONS) as llm:
        before = llm.generate(prompt, GREEDY)[0].outputs[0].token_ids
        with torch.no_grad():
            model.lm_head.weight.mul_(-1.0)  # tied to the embedding: the greedy choice changes
        llm.weights_updated()
        after = llm.generate(prompt, GREEDY)[0].outputs[0].token_ids
        with torch.no_grad():
            model.lm_head.weight.mul_(-1.0)
        llm.weights_updated()
        again = llm.generate(prompt, GREEDY)[0].outputs[0].token_ids
    assert before != after and again == before


def test_auto_and_refusals(tiny):
    model, tok = tiny
    with LLM.from_module(copy.deepcopy(model), tok, **ENGINE_TEST_OPTIONS) as llm:
        choice = llm.engine.quantization
        assert choice.requested == "auto" and choice.mode == "none"
        assert "GGUF" in choice.reason and "quantization none" in choice.describe()
    with pytest.raises(ConfigError, match="not loaded from a GGUF file"):
        LLM.from_module(copy.deepcopy(model), tok, quantization="gguf", **ENGINE_TEST_OPTIONS)
    with pytest.raises(ConfigError, match="float32 or bfloat16"):
        LLM.from_module(
            copy.deepcopy(model).to(torch.float16), tok, quantization="int8", dtype="float16",
            **ENGINE_TEST_OPTIONS,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="quantization must be"):
        LLM.from_module(copy.deepcopy(model), tok, quantization="q3", **ENGINE_TEST_OPTIONS)


def test_timings_are_measured_once_and_cached(tiny, kernels, tmp_path, monkeypatch):
    import vriksha.engine.quant_linear as ql

    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    model, _ = tiny
    packed = {"lm_head": quantize_int8(model.lm_head.weight)}
    packed_s, dense_s = QuantLinear(model, packed, kernels).step_seconds(1)
    assert packed_s > 0 and dense_s > 0
    assert (tmp_path / "quant_linear.json").is_file()

    def refuse(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(ql, "measure", refuse)
    assert QuantLinear(model, packed, kernels).step_seconds(1) == (packed_s, dense_s)


def test_the_option_is_a_flag():
    import argparse

    from vriksha.engine.config import EngineConfig

    parser = argparse.ArgumentParser()
    EngineConfig.add_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args(["--quantization", "int8"])).quantization == "int8"
    assert EngineConfig().quantization == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "q2"])
    args = parser.parse_args(["--packed-activations", "int8"])
    assert EngineConfig.from_args(args).packed_activations == "int8"
    assert EngineConfig().packed_activations == "auto"
    with pytest.raises(ConfigError, match="packed_activations must be one of auto, float32, int16, int8"):
        EngineConfig(packed_activations="int4")


def test_large_buckets_are_extrapolated_not_timed(kernels, monkeypatch):
    """A bucket whose call would exceed MAX_TIMED_MACS multiply-adds takes the last timed bucket's path and its
    times scaled by the rows (the output head's large buckets would otherwise take seconds to time)."""
    import vriksha.engine.measured_router as mr
    import vriksha.engine.quant_linear as ql

    monkeypatch.setattr(mr, "MAX_TIMED_MACS", 64 * 64 * 4)  # rows above 4 are not timed
    times = ql.measure("q8_0", 64, 64, kernels, None)
    timed = ql.BUCKETS.index(4)
    assert all(t > 0 for t in times["packed"] + times["dense"])
    for i in range(timed + 1, len(ql.BUCKETS)):
        scale = ql.BUCKETS[i] / ql.BUCKETS[i - 1]
        assert times["packed"][i] == pytest.approx(times["packed"][i - 1] * scale)
        assert times["dense"][i] == pytest.approx(times["dense"][i - 1] * scale)
        assert times["path"][i] == times["path"][timed]


def test_a_native_decode_step_keeps_packed_where_only_bf16_arithmetic_beat_it(tiny, kernels):
    """Where the dense path won only through bf16 arithmetic (which a native step cannot call), the Python
    forward takes the dense path and a native decode step the packed kernel."""
    from vriksha.engine.quant_linear import BUCKETS

    model, _ = tiny
    model = copy.deepcopy(model)
    packed = {n: quantize_int8(m.weight) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    router = QuantLinear(model, packed, kernels)
    path = kernels.paths[0]
    n = len(BUCKETS)
    record = {"packed": [2.0] * n, "path": [path] * n, "dense": [1.0] * n, "dense_native": [3.0] * n}
    record["dense"][0] = 5.0  # one row: packed beats both
    router.times = {router.key(w): record for _, w in router.layers}
    with ModuleInstallation(model) as installation:
        router.install(installation, measured=True)
        module = router.layers[0][0]
        assert router.packed_for(module, 1) == (router.layers[0][1], path)
        assert router.packed_for(module, 16) is None
        assert router.packed_for(module, 16, native=True) == (router.layers[0][1], path)
        router.enabled = False
        assert router.packed_for(module, 16, native=True) is None
