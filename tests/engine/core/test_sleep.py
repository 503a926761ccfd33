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
    assert all(t.untyped_storage().nbytes() == 0 for t in (*pool.k, *pool.v))
    assert pool.released and llm.engine.cache.evictable_size() == 0
    with pytest.raises(InvalidRequestError, match="wake_up"):
        llm.generate(PROMPTS[:1], GREEDY)
    llm.sleep()  # twice: nothing more to do
    llm.wake_up()
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in (*pool.k, *pool.v))
    after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert after == before
    llm.wake_up()  # awake already: nothing happens
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == before
    llm.close()


def test_the_freed_pool_leaves_the_process(default_tokenizer):
    """A pool of 100 MiB in tensors under glibc's mmap threshold (heap blocks, which the engine otherwise keeps
    mapped): the resident memory drops by most of it at sleep and comes back at wake-up."""
    llm = LLM.from_module(
        tiny_model("llama", VOCAB), default_tokenizer, kv_cache_memory_gb=0.1, max_model_len=256
    )
    size = llm.engine.pool.nbytes
    awake = rss()
    llm.sleep()
    asleep = rss()
    assert awake - asleep > 0.8 * size
    llm.wake_up()
    assert rss() - asleep > 0.8 * size
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
