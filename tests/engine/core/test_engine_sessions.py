"""Sessions through the engine: multi-turn episodes under a pool too small for all of them keep their K/V
pinned between turns, outputs stay the model's own, and the books close."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.errors import InvalidRequestError

VOCAB = 512
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, head_dim 16, fp32


def make_llm(tokenizer, pool_tokens: int, **kwargs) -> LLM:
    return LLM.from_module(
        tiny_model("llama", VOCAB),
        tokenizer,
        kv_cache_memory_gb=pool_tokens * BYTES_PER_TOKEN / 2**30,
        max_model_len=256,
        **kwargs,
    )


def play(llm: LLM, episodes: int, turns: int, sessions: bool) -> tuple[list[list[int]], int, int]:
    """Episodes in lockstep: each turn appends a 'tool result' and generates again over the whole history;
    between turns a burst of one-off prompts fills the pool. Returns each episode's final tokens, and the
    episodes' prompt tokens and of those, cached ones."""
    g = torch.Generator().manual_seed(0)
    history = [torch.randint(0, VOCAB, (30,), generator=g).tolist() for _ in range(episodes)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = cached = 0
    for t in range(turns):
        ids = [f"ep{i}" if sessions else None for i in range(episodes)]
        outs = llm.generate([{"prompt_token_ids": h} for h in history], params, session_id=ids)
        for i, out in enumerate(outs):
            history[i] = (
                history[i] + out.outputs[0].token_ids + torch.randint(0, VOCAB, (5,), generator=g).tolist()
            )
            if t > 0:
                prompt += len(out.prompt_token_ids)
                cached += out.num_cached_tokens
        noise = [{"prompt_token_ids": torch.randint(0, VOCAB, (43,), generator=g).tolist()} for _ in range(5)]
        llm.generate(noise, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    if sessions:
        for i in range(episodes):
            assert llm.close_session(f"ep{i}")
    return history, prompt, cached


def test_sessions_keep_episodes_cached_under_pressure_and_outputs_unchanged(default_tokenizer):
    lru = make_llm(default_tokenizer, 240)
    pinned = make_llm(default_tokenizer, 240, session_pin_fraction=0.6)
    a, prompt_a, cached_a = play(lru, episodes=2, turns=4, sessions=False)
    b, prompt_b, cached_b = play(pinned, episodes=2, turns=4, sessions=True)
    assert a == b  # greedy output is the model's own with or without pins
    assert prompt_a == prompt_b
    assert cached_b > 1.5 * cached_a, (cached_a, cached_b)
    stats = pinned.stats()
    assert stats.kv_pinned_tokens == 0 and stats.open_sessions == 0
    engine = pinned.engine
    free, tree = engine.allocator.free_slot_set(), engine.cache.slot_set()
    assert not (free & tree) and len(free) + len(tree) == engine.allocator.capacity


def test_stats_count_pins_and_bad_session_ids_are_named(default_tokenizer):
    llm = make_llm(default_tokenizer, 400)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate({"prompt_token_ids": list(range(10, 30))}, params, session_id="s")
    stats = llm.stats()
    assert stats.open_sessions == 1 and stats.pinned_sessions == 1 and stats.kv_pinned_tokens == 22
    assert not llm.close_session("nope") and llm.close_session("s")
    assert llm.stats().kv_pinned_tokens == 0
    with pytest.raises(InvalidRequestError, match="session"):
        llm.generate({"prompt_token_ids": [1, 2]}, params, session_id="")
