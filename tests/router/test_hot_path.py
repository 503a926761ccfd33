"""The router's per-request hot path: the common-prefix helper, the cached tokenizer, the request parser."""

from __future__ import annotations

import json
import os
import random

import pytest
from fastapi.exceptions import RequestValidationError

from vriksha.kv_events.token_tree import TokenTree
from vriksha.prefix_tree import common_prefix_len
from vriksha.router.app import parse_request
from vriksha.router.tokens import CachedEncoder
from vriksha.server.protocol import CompletionRequest


def test_common_prefix_len_agrees_with_the_plain_loop() -> None:
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        start = rng.randrange(0, 3)
        b = [9] * start + b
        assert common_prefix_len(a, b, start) == len(os.path.commonprefix([a, b[start:]]))


def test_tree_match_inside_a_long_node_and_on_tuples() -> None:
    tree = TokenTree.from_paths([list(range(1000))])
    assert tree.match(list(range(637)) + [5, 6]) == 637
    assert tree.match(tuple(range(1200))) == 1000


@pytest.fixture(scope="module")
def tokenizer():
    from tests.tiny_llama import embedded_tokenizer

    return embedded_tokenizer()


def test_cached_encoder_gives_the_tokenizers_ids(tokenizer) -> None:
    enc = CachedEncoder(tokenizer, max_entries=3)
    texts = [
        "Hi",
        " leading space",
        "two  spaces\tand tab\n",
        "<|im_start|>user\nhé ünïcode 😀<|im_end|>",
        "",
    ]
    for t in [t for t in texts for _ in range(2)]:  # each twice in a row: the second is a hit
        assert enc.encode(t, add_special_tokens=False) == tokenizer.encode(t, add_special_tokens=False)
    assert enc.hits == len(texts) and len(enc._cache) <= 3
    ids = enc.encode("Hi", add_special_tokens=False)
    ids.append(-1)  # callers own what they get: the cached entry stays intact
    assert enc.encode("Hi", add_special_tokens=False) == tokenizer.encode("Hi", add_special_tokens=False)
    assert enc.encode("Hi") == tokenizer.encode("Hi")  # with special tokens: the tokenizer's own path
    assert enc.bos_token_id == tokenizer.bos_token_id  # everything else is the tokenizer's


def test_parse_errors_as_a_replica_words_them() -> None:
    body = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 1}).encode()
    assert parse_request(CompletionRequest, body).prompt == "Hi"
    with pytest.raises(RequestValidationError) as bad_json:
        parse_request(CompletionRequest, b'{"model": "m", ')
    assert bad_json.value.errors()[0]["type"] == "json_invalid"
    with pytest.raises(RequestValidationError) as unknown:
        parse_request(CompletionRequest, json.dumps({"model": "m", "prompt": "x", "nope": 1}).encode())
    assert any(e["loc"][-1] == "nope" for e in unknown.value.errors())
    with pytest.raises(RequestValidationError) as empty:
        parse_request(CompletionRequest, b"  ")
    assert empty.value.errors()[0]["type"] == "missing"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "prompt": "\\ud800"}',  # a lone surrogate: not valid Unicode
        b'{"model": "m", "prompt": "x", "max_tokens": "3"}',  # no coercion
        b'{"model": "m", "prompt": "x", "max_tokens": 1.5}',
        b'{"model": "m", "prompt": "x", "temperature": NaN}',
        b'[{"model": "m", "prompt": "x"}]',
    ],
)
def test_parse_refuses_what_a_replica_refuses(body: bytes) -> None:
    with pytest.raises(RequestValidationError):
        parse_request(CompletionRequest, body)


def test_pending_prompts_count_until_they_expire_or_settle() -> None:
    import time

    from vriksha.router.config import ReplicaSpec
    from vriksha.router.replica import Replica

    r = Replica(ReplicaSpec("http://r0"), 0, healthy=True)
    a, b = list(range(100)), list(range(50)) + [7] * 50
    r.add_pending(a, ttl_s=30.0)
    r.add_pending(b, ttl_s=30.0)
    assert r.cached_prefix(list(range(80)) + [1]) == 80  # a's run, past where b leaves it
    assert r.cached_prefix(list(range(50)) + [7, 7, 3]) == 52  # b's
    assert r.cached_prefix([5, 1]) == 0
    r.settle_pending(a, grace_s=0.0)  # a's request ended: its events are due, stop assuming it
    time.sleep(0.01)
    assert r.cached_prefix(list(range(80))) == 50  # only b is left
    assert [p for _, p in r.pending] == [b]
