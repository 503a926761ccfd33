"""A GGUF in the K-quant and 5-bit formats loads: a tiny Qwen2 whose weights are Q2_K ... Q6_K, Q5_0, Q5_1 and the
packed formats converts once into the cache, every tensor equal to the `gguf` package's dequantization of its
blocks; the packed kernels claim only the layers in their own formats (Q2_K and Q3_K stay dense), and the
engine serving those layers packed decodes the dense engine's greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.gguf_files import random_blocks

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
# one format per linear weight, in turn: every format the loader dequantizes, the packed ones among them
FORMATS = ["Q4_K", "Q5_0", "Q6_K", "Q5_K", "Q5_1", "Q3_K", "Q2_K", "Q8_0", "Q4_0", "Q4_1"]
PACKED = {"Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}


def _config():
    from tests.gguf_files import tiny_qwen2_config

    return tiny_qwen2_config(hidden_size=256, intermediate_size=512)  # K-quant rows: whole super-blocks


def _write(path, cfg, tokenizer: bool) -> dict[str, tuple[str, np.ndarray]]:
    """The file, and {Transformers parameter: (its GGUF type, the reference weight)}."""
    import transformers as T

    from tests.gguf_files import finish, qwen2_gguf_name, qwen2_writer

    writer = qwen2_writer(path, cfg, tokenizer=tokenizer)
    rng = np.random.default_rng(0)
    expected: dict[str, tuple[str, np.ndarray]] = {}
    linear = 0
    for name, param in T.Qwen2ForCausalLM(cfg).state_dict().items():
        rows, cols = param.shape if param.dim() == 2 else (1, param.shape[0])
        if param.dim() == 1:  # norms and biases stay F32, as llama.cpp writes them
            weight = rng.standard_normal(cols).astype(np.float32)
            writer.add_tensor(qwen2_gguf_name(name), weight)
            expected[name] = ("F32", weight)
            continue
        type_name = FORMATS[linear % len(FORMATS)]
        linear += 1
        data = random_blocks(type_name, rows, cols // gguf.GGML_QUANT_SIZES[Q[type_name]][0], seed=linear)
        writer.add_tensor(qwen2_gguf_name(name), data, raw_dtype=Q[type_name])
        expected[name] = (type_name, gguf.quants.dequantize(data, Q[type_name]))
    finish(writer)
    return expected


@pytest.mark.slow
def test_every_tensor_converts_to_the_gguf_reference(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from vriksha.loading import resolve_model_path
    from vriksha.loading.gguf_index import read_gguf_index

    path = tmp_path / "tiny-kquant.gguf"
    expected = _write(path, _config(), tokenizer=True)
    types = {t.type_name for t in read_gguf_index(path).tensors}
    assert set(FORMATS) <= types
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path / "cache"))
    converted = load_file(resolve_model_path(str(path)) / "model.safetensors")
    assert set(converted) == set(expected)
    for name, (type_name, want) in expected.items():
        got = converted[name]
        assert got.dtype == torch.float32, name
        assert torch.equal(got.reshape(-1), torch.from_numpy(want).reshape(-1)), f"{name} ({type_name})"


def test_the_packed_router_claims_only_its_own_formats(tmp_path):
    from vriksha.loading.gguf_weights import gguf_linear_types, read_gguf_linears

    path = tmp_path / "tiny-kquant.gguf"
    expected = _write(path, _config(), tokenizer=False)
    linears = {name.removesuffix(".weight"): t for name, (t, w) in expected.items() if w.ndim == 2}
    linears.pop("model.embed_tokens")  # an embedding, not a linear layer (the head is untied)
    packed = read_gguf_linears(path, tie_word_embeddings=False)
    assert {m: w.qtype for m, w in packed.items()} == {
        m: t.lower() for m, t in linears.items() if t in PACKED
    }
    types = sorted(qtype or "dense" for qtype, _, _ in gguf_linear_types(path, tie_word_embeddings=False))
    assert types == sorted(t.lower() if t in PACKED else "dense" for t in linears.values())


def _adapter(model):
    """A random LoRA adapter on every decoder linear layer (B random too, else a no-op)."""
    from vriksha.lora import LoraAdapter, LoraWeights

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    g = torch.Generator().manual_seed(7)
    modules = {
        n: LoraWeights(
            torch.randn(4, m.in_features, generator=g) * 0.3,
            torch.randn(m.out_features, 4, generator=g) * 0.3,
        )
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets
    }
    return LoraAdapter("ad", 4, 8.0, targets, modules)


@pytest.mark.slow
def test_the_packed_engine_decodes_the_dense_engines_greedy_tokens(tmp_path):
    """With and without a LoRA adapter over the packed layers."""
    from tests.engine.conftest import ENGINE_TEST_OPTIONS
    from vriksha import LLM, SamplingParams
    from vriksha.loading import load_model

    path = tmp_path / "tiny-kquant.gguf"
    expected = _write(path, _config(), tokenizer=True)
    loaded = load_model(str(path))  # the conversion is cached by the file's content
    adapter = _adapter(loaded.model)
    prompts = [[5, 17, 300, 42], [900, 3], list(range(100, 131))]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for mode in ("none", "gguf"):
        with LLM.from_module(
            loaded.model,
            loaded.tokenizer,
            model=str(path),
            quantization=mode,
            enable_lora=True,
            max_lora_rank=4,
            **ENGINE_TEST_OPTIONS,
        ) as llm:
            choice = llm.engine.quantization
            assert choice.mode == mode
            if mode == "gguf":
                linear = [t for n, (t, w) in expected.items() if w.ndim == 2 and "embed" not in n]
                assert choice.formats == {t.lower(): linear.count(t) for t in set(linear) if t in PACKED}
                quant = llm.engine.runner.quant
                assert len(quant.always_packed()) == len(quant.layers) == sum(choice.formats.values())
            llm.engine.add_lora(adapter)
            base = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
            adapted = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, lora="ad")]
            assert adapted != base  # the adapter changes the answer
            outs[mode] = (base, adapted)
    assert outs["gguf"] == outs["none"]
