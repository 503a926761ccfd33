"""`LLM.sleep()` / `LLM.wake_up()`: the KV pool's memory is freed and taken back, greedy tokens unchanged."""

import os

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.errors import InvalidRequestError

VOCAB = 512


def rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = [{"prompt_token_ids": list(range(7, 7 + n))} for n in (5, 17, 40)]


@pytest.mark.parametrize("native_kernels", [True, False])
def test_sleep_frees_the_pool_and_wake_up_gives_the_same_greedy_tokens(default_tokenizer, native_kernels):
    llm = LLM.from_module(
        tiny_model("llama", VOCAB), default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=256,
        native_kernels=native_kernels,
    )  # fmt: skip
    pool = llm.engine.pool
    before = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert llm.engine.cache.evictable_size() > 0  # prefixes were cached
    llm.sleep()
    assert all(not t.any() for t in (*pool.k, *pool.v))  # given back: it reads as zero
    assert pool.released and llm.engine.cache.evictable_size() == 0
    with pytest.raises(InvalidRequestError, match="wake_up"):
        llm.generate(PROMPTS[:1], GREEDY)
    llm.sleep()  # twice: nothing more to do
    llm.wake_up()
    assert not pool.released
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in (*pool.k, *pool.v))
    after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert after == before
    llm.wake_up()  # awake already: nothing happens
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == before
    llm.close()


def test_the_pool_is_resident_only_where_written_and_leaves_the_process_at_sleep(default_tokenizer):
    """A pool of 100 MiB: untouched at construction (zeroed without writing), resident once written, out of the
    process at sleep, and not resident again at wake-up until slots are written."""
    llm = LLM.from_module(
        tiny_model("llama", VOCAB), default_tokenizer, kv_cache_memory_gb=0.1, max_model_len=256
    )
    pool = llm.engine.pool
    size = pool.nbytes
    untouched = rss()
    for t in (*pool.k, *pool.v):
        t.fill_(1.0)  # every slot written
    written = rss()
    assert written - untouched > 0.8 * size
    llm.sleep()
    asleep = rss()
    assert written - asleep > 0.8 * size
    llm.wake_up()
    assert rss() - asleep < 0.1 * size
    assert all(not t.any() for t in (*pool.k, *pool.v))
    greedy = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert all(greedy)
    llm.close()


def test_sleep_refuses_while_requests_run(default_tokenizer):
    llm = LLM.from_module(
        tiny_model("llama", VOCAB), default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=256
    )
    llm.engine.add_request(PROMPTS[0], GREEDY)
    with pytest.raises(InvalidRequestError, match="requests run"):
        llm.sleep()
    assert not llm.engine.pool.released and torch.is_tensor(llm.engine.pool.k[0])
    llm.close()
