"""The engine's lean forward equals the Transformers forward it replaces, and is used only where it applies."""

import copy

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.fast_forward import unsupported_reason


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "qwen2-sliding"])
def test_lean_forward_matches_transformers_forward(name, default_tokenizer):
    vocab = 512
    model = tiny_model(name, vocab)
    assert unsupported_reason(model) is None
    common = dict(chunked_prefill_size=8, max_num_batched_tokens=24, kv_cache_memory_gb=0.01, max_model_len=256)
    lean = LLM.from_module(copy.deepcopy(model), default_tokenizer, **common)
    plain = LLM.from_module(copy.deepcopy(model), default_tokenizer, fast_forward=False, **common)
    assert lean.engine.runner.fast_forward is not None and plain.engine.runner.fast_forward is None
    g = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(0, vocab, (n,), generator=g).tolist()} for n in (1, 9, 30)]
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=5, logprobs=2)
    a, b = lean.generate(prompts, params), plain.generate(prompts, params)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert x.outputs[0].token_logprobs == pytest.approx(y.outputs[0].token_logprobs, abs=1e-5)


def test_other_layer_classes_keep_the_transformers_forward(default_tokenizer):
    model = tiny_model("gemma3", 512)
    assert "Gemma3DecoderLayer" in unsupported_reason(model)
    llm = LLM.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=128)
    assert llm.engine.runner.fast_forward is None
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
