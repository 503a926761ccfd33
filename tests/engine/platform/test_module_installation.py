"""The engine hands a module back as it came: `LLMEngine.close()` and an `LLM` going out of scope undo its changes."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.core.llm_engine import EngineClosedError

VOCAB = 512


def snapshot(model: torch.nn.Module) -> dict:
    """Every module's own attributes (by identity) and every config's attention implementation."""
    modules = {name: dict(vars(m)) for name, m in model.named_modules()}
    configs = {
        name: m.config._attn_implementation for name, m in model.named_modules() if hasattr(m, "config")
    }
    return {"modules": modules, "attn": configs}


def same(a: dict, b: dict) -> bool:
    if a["attn"] != b["attn"] or a["modules"].keys() != b["modules"].keys():
        return False
    return all(
        x.keys() == y.keys() and all(x[k] is y[k] for k in x)
        for x, y in zip(a["modules"].values(), b["modules"].values(), strict=True)
    )


def forward(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(1, 20)[None]
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize(
    "family, how", [("llama", "close"), ("llama", "out_of_scope"), ("llama", "with"), ("gemma3", "close")]
)
def test_a_wrapped_module_is_returned_as_it_came(default_tokenizer, family, how):
    model = tiny_model(family, VOCAB)
    before, logits = snapshot(model), forward(model)
    llm = LLM.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=128)
    assert not same(snapshot(model), before), (
        "the engine should have installed its attention and linear paths"
    )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], params)
    assert len(out[0].outputs[0].token_ids) == 4
    if how == "close":
        engine = llm.engine
        llm.close()
        with pytest.raises(EngineClosedError, match="closed"):
            engine.add_request([1, 2, 3], params)
        llm.close()  # twice is harmless
    elif how == "out_of_scope":
        del llm, out
        gc.collect()
    else:
        with llm:
            pass
    assert same(snapshot(model), before)
    torch.testing.assert_close(forward(model), logits, rtol=0, atol=0)


def test_an_engine_given_to_llm_is_not_closed_with_it(default_tokenizer):
    from vriksha.engine.core.llm_engine import LLMEngine

    model = tiny_model("llama", VOCAB)
    engine = LLMEngine.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=128)
    LLM(engine=engine).close()
    assert engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    engine.close()
    assert "forward" not in vars(model.lm_head)
