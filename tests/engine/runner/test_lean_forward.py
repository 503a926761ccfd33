"""The engine's lean forward equals the Transformers forward it replaces, and is used only where it applies."""

import pytest

from tests.engine.conftest import assert_same_samples, engines_over, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.runner.lean_forward import LeanForward, unsupported_reason


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "qwen2-sliding"])
def test_lean_forward_matches_transformers_forward(name, default_tokenizer):
    vocab = 512
    model = tiny_model(name, vocab)
    assert unsupported_reason(model) is None
    lean, plain = engines_over(model, default_tokenizer, fast_forward=False)
    assert lean.engine.runner.path(LeanForward) is not None and plain.engine.runner.path(LeanForward) is None
    assert_same_samples(lean, plain, vocab, seed=3, n=1, atol=1e-5)


def test_other_layer_classes_keep_the_transformers_forward(default_tokenizer):
    model = tiny_model("gemma3", 512)
    assert "Gemma3DecoderLayer" in unsupported_reason(model)
    llm = LLM.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=128)
    assert llm.engine.runner.path(LeanForward) is None
    out = llm.generate(
        [{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )
    assert len(out[0].outputs[0].token_ids) == 4
