"""The semantic cache on its own: similarity threshold, number guard, TTL, size bound, and scopes that keep
API keys, pools and conversation contexts apart."""

from __future__ import annotations

import time

import torch

from vriksha.router.semantic.cache import SemanticCache, scope_key
from vriksha.router.semantic.config import CacheConfig


def _unit(*xs: float) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.tensor(xs, dtype=torch.float32), dim=0)


def _chat(text: str, **extra) -> dict:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def test_hit_above_threshold_miss_below():
    c = SemanticCache(CacheConfig(enabled=True, threshold=0.9))
    s = scope_key("k", "p", "/v1/chat/completions", _chat("a"), "a")
    c.store(s, _unit(1, 0, 0), "tell me a joke", b"joke")
    assert c.lookup(s, _unit(1, 0.1, 0), "tell me a joke please") == (b"joke", float(_unit(1, 0.1, 0)[0]))
    assert c.lookup(s, _unit(1, 1, 0), "something else") is None


def test_numbers_must_match():
    c = SemanticCache(CacheConfig(enabled=True, threshold=0.9))
    c.store("s", _unit(1, 0), "what is 17 * 23", b"391")
    assert c.lookup("s", _unit(1, 0), "what is 17 * 24") is None
    assert c.lookup("s", _unit(1, 0), "what's 17 * 23") is not None
    loose = SemanticCache(CacheConfig(enabled=True, threshold=0.9, same_numbers=False))
    loose.store("s", _unit(1, 0), "what is 17 * 23", b"391")
    assert loose.lookup("s", _unit(1, 0), "what is 17 * 24") is not None


def test_ttl_and_size_bound():
    c = SemanticCache(CacheConfig(enabled=True, threshold=0.9, ttl_s=0.05, max_entries=2))
    c.store("s", _unit(1, 0, 0), "x", b"1")
    time.sleep(0.1)
    assert c.lookup("s", _unit(1, 0, 0), "x") is None and len(c) == 0
    c.store("s", _unit(1, 0, 0), "x", b"1")
    c.store("s", _unit(0, 1, 0), "y", b"2")
    c.store("t", _unit(0, 0, 1), "z", b"3")
    assert len(c) == 2
    assert c.lookup("s", _unit(1, 0, 0), "x") is None  # the oldest went first
    assert c.lookup("t", _unit(0, 0, 1), "z") == (b"3", 1.0)


def test_scopes_separate_keys_pools_endpoints_and_contexts():
    body = _chat("hi")
    base = scope_key("alice", "fast", "/v1/chat/completions", body, "hi")
    assert base == scope_key(
        "alice", "fast", "/v1/chat/completions", _chat("hello there", stream=False), "hello there"
    )
    assert base != scope_key("bob", "fast", "/v1/chat/completions", body, "hi")
    assert base != scope_key(None, "fast", "/v1/chat/completions", body, "hi")
    assert base != scope_key("alice", "careful", "/v1/chat/completions", body, "hi")
    assert base != scope_key("alice", "fast", "/v1/completions", body, "hi")
    assert base != scope_key("alice", "fast", "/v1/chat/completions", _chat("hi", max_tokens=5), "hi")
    earlier = {**body, "messages": [{"role": "system", "content": "be terse"}, *body["messages"]]}
    assert base != scope_key("alice", "fast", "/v1/chat/completions", earlier, "hi")
    c = SemanticCache(CacheConfig(enabled=True))
    c.store(base, _unit(1, 0), "hi", b"for alice")
    other = scope_key("bob", "fast", "/v1/chat/completions", body, "hi")
    assert c.lookup(other, _unit(1, 0), "hi") is None


def test_number_words_count_as_numbers_and_word_order_matters():
    from vriksha.router.semantic.cache import numbers, same_order, words

    assert numbers("give me three tips, then the 2nd one twice") == ("3", "2", "2")  # "one": a pronoun
    assert numbers("give me 3 tips") == numbers("Give me three tips")
    c = SemanticCache(CacheConfig(enabled=True, threshold=0.9))
    c.store("s", _unit(1, 0), "Give me three tips for better sleep", b"tips")
    assert c.lookup("s", _unit(1, 0), "give me 3 tips for better sleep") is not None
    assert c.lookup("s", _unit(1, 0), "Give me five tips for better sleep") is None
    c.store("s", _unit(0, 1), "Convert 10 miles to kilometres", b"16.09")
    assert c.lookup("s", _unit(0, 1), "Convert 10 kilometres to miles") is None
    assert c.lookup("s", _unit(0, 1), "convert 10 miles into kilometres") is not None
    assert same_order(words("what is the height of mount everest"), words("how tall is mount everest"))


def test_might_hit_by_the_cheap_vectors_within_the_scope_only():
    c = SemanticCache(CacheConfig(enabled=True, threshold=0.9, ttl_s=0.2))
    assert not c.might_hit("s", _unit(1, 0), 0.9)  # nothing stored
    c.store("s", _unit(0, 1), "tell me a joke", b"joke", prefilter_emb=_unit(1, 0))
    assert c.might_hit("s", _unit(1, 0.1), 0.9)
    assert not c.might_hit("s", _unit(0, 1), 0.9)  # far by the cheap vector, whatever the other says
    assert not c.might_hit("other scope", _unit(1, 0), 0.9)
    c.store("t", _unit(0, 1), "no cheap vector", b"x")
    assert c.might_hit("t", _unit(0, 1), 0.99)  # an entry without one always might
    time.sleep(0.25)
    assert not c.might_hit("s", _unit(1, 0), 0.9)  # expired entries do not count
