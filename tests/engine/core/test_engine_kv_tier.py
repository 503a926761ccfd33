"""The second KV tier through the engine: a prefix evicted to the tier and asked for again is loaded, not
recomputed; with the float32 tier the outputs equal those of a pool large enough to keep it; the int8 tier's
effect on the embedded model's greedy tokens and log-probs stays within a bound."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.errors import ConfigError

VOCAB = 512


def tokens(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def replay(llm: LLM, vocab: int = VOCAB, prefix_len: int = 60, noise: int = 3, max_tokens: int = 8):
    """A prompt, enough other prompts to push it out of a small pool, then the prompt again with more."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    first = tokens(prefix_len, 1, vocab)
    llm.generate({"prompt_token_ids": first}, params)
    for i in range(noise):
        llm.generate({"prompt_token_ids": tokens(60, 10 + i, vocab)}, params)
    return llm.generate({"prompt_token_ids": first + tokens(5, 2, vocab)}, params)[0]


def make(tokenizer, pool: int, **kwargs) -> LLM:
    return LLM.from_module(
        tiny_model("llama", VOCAB), tokenizer, kv_cache_tokens=pool, max_model_len=256, **kwargs
    )


def test_a_prefix_evicted_to_the_float32_tier_is_loaded_and_outputs_are_unchanged(default_tokenizer):
    roomy = replay(make(default_tokenizer, 2000))
    lru = replay(make(default_tokenizer, 140))
    tiered_llm = make(default_tokenizer, 140, kv_tier_tokens=1000, kv_tier_dtype="float32")
    tiered = replay(tiered_llm)
    assert roomy.num_cached_tokens == 60 and lru.num_cached_tokens == 0  # the small pool lost it
    assert tiered.num_cached_tokens == 60  # loaded back from the tier: not recomputed
    stats = tiered_llm.stats()
    assert stats.kv_tier_loaded_tokens >= 60 and stats.kv_tier_written_tokens >= 60
    assert stats.kv_tier_total_tokens == 1000
    assert tiered.outputs[0].token_ids == roomy.outputs[0].token_ids
    # the same K/V values (a pool of another size reads them from other addresses: float rounding only)
    torch.testing.assert_close(
        tiered.outputs[0].token_logprobs, roomy.outputs[0].token_logprobs, atol=1e-5, rtol=0
    )


def test_the_tier_needs_the_prefix_cache(default_tokenizer):
    with pytest.raises(ConfigError, match="kv-tier-tokens"):
        make(default_tokenizer, 140, kv_tier_tokens=100, enable_prefix_caching=False)


def test_int8_tier_keeps_the_embedded_models_greedy_tokens_and_log_probs_close():
    """Measured bound: with the int8 tier the continuation of an evicted-and-reloaded prefix keeps its greedy
    tokens and every token's log-prob moves by less than 0.1 (the figure is in docs/engine.md)."""
    kwargs = dict(max_model_len=512, max_num_seqs=4)
    roomy_llm = LLM(kv_cache_tokens=4000, **kwargs)
    vocab = roomy_llm.engine.vocab_size
    roomy = replay(roomy_llm, vocab, prefix_len=120, max_tokens=12)
    roomy_llm.close()
    tier_llm = LLM(kv_cache_tokens=300, kv_tier_tokens=4000, kv_tier_dtype="int8", **kwargs)
    tiered = replay(tier_llm, vocab, prefix_len=120, max_tokens=12)
    assert tiered.num_cached_tokens == 120 and tier_llm.stats().kv_tier_loaded_tokens >= 120
    tier_llm.close()
    assert tiered.outputs[0].token_ids == roomy.outputs[0].token_ids
    drift = max(
        abs(a - b)
        for a, b in zip(tiered.outputs[0].token_logprobs, roomy.outputs[0].token_logprobs, strict=True)
    )
    print(f"int8 tier: max |d logprob| = {drift:.4f} over {len(roomy.outputs[0].token_ids)} greedy tokens")
    assert drift < 0.1
