"""The packaged Gemma 3 270M (base; opt-in: `make models MODEL=gemma-3-270m`): its four parts join into the
pinned GGUF, Transformers loads the architecture, and the engine decodes Transformers' greedy tokens from prompts
that start with the tokenizer's <bos> (the engine encodes prompt text without it; Gemma needs it)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.packaged_models import require_packaged

MODEL = "gemma-3-270m"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]

pytestmark = pytest.mark.slow


def test_gemma3_joins_loads_and_decodes_as_transformers():
    from transformers import AutoModelForCausalLM

    from vriksha import LLM, SamplingParams
    from vriksha.loading import resolve_model_path
    from vriksha.loading.gguf_index import read_gguf_index
    from vriksha.loading.registry import find_packaged, packaged_gguf

    require_packaged(MODEL)
    index = read_gguf_index(packaged_gguf(find_packaged(MODEL)))
    assert (
        index.metadata["general.architecture"] == "gemma3" and "tokenizer.chat_template" not in index.metadata
    )
    assert Counter(t.type_name for t in index.tensors) == {
        "F32": 109,
        "Q5_0": 81,
        "Q4_K": 27,
        "Q8_0": 10,
        "Q6_K": 9,
    }
    params = SamplingParams(max_tokens=16, temperature=0.0)
    with LLM(model=MODEL, dtype="float32", quantization="none", kv_cache_memory_gb=0.1) as llm:
        ids = [llm.tokenizer(p)["input_ids"] for p in PROMPTS]
        assert all(i[0] == llm.tokenizer.bos_token_id for i in ids)
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": i} for i in ids], params)]
    reference = AutoModelForCausalLM.from_pretrained(resolve_model_path(MODEL), dtype=torch.float32).eval()
    assert type(reference).__name__ == "Gemma3ForCausalLM"
    for prompt, prompt_ids, tokens in zip(PROMPTS, ids, got, strict=True):
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([prompt_ids]), max_new_tokens=16, do_sample=False, top_k=None, top_p=None
            )
        assert tokens == out[0, len(prompt_ids) :].tolist(), prompt
