"""The engine's greedy output equals Transformers' generate() on tiny random models of several families."""

import copy

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3"]


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_matches_transformers(family, prefix_caching, default_tokenizer):
    vocab = 512
    reference = tiny_model(family, vocab)
    engine_model = copy.deepcopy(reference)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, vocab, (20,), generator=g).tolist()
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 5, 17, 40)]
    prompts += [shared + [7, 8, 9], shared + [10], shared + list(range(30))]
    llm = LLM.from_module(
        engine_model, default_tokenizer, chunked_prefill_size=8, max_num_batched_tokens=24,
        enable_prefix_caching=prefix_caching, kv_cache_memory_gb=0.01, max_model_len=256,
    )
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, 12), f"diverged on prompt of {len(prompt)}"
    if prefix_caching:
        again = llm.generate([{"prompt_token_ids": shared + [7, 8, 9]}], params)[0]
        assert again.num_cached_tokens == len(shared) + 2
        assert again.outputs[0].token_ids == outs[4].outputs[0].token_ids
