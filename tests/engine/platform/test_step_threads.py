"""Small steps leave a core to a front end in the same process; large ones, and engines without one, keep all."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import assert_same_samples, engines_over, tiny_model
from vriksha.engine.config import PlatformConfig
from vriksha.engine.core.async_engine import AsyncEngine
from vriksha.engine.platform.step_threads import SMALL_STEP_TOKENS, StepThreads
from vriksha.errors import ConfigError


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_steps_run_on_one_thread_fewer(two_threads):
    threads = StepThreads("on", host=True)
    threads.apply(SMALL_STEP_TOKENS)
    assert torch.get_num_threads() == 1
    threads.apply(SMALL_STEP_TOKENS + 1)
    assert torch.get_num_threads() == 2
    threads.apply(1)
    assert torch.get_num_threads() == 1 and threads.full == 2
    assert "at most 16 tokens on 1 thread(s), larger ones on 2" in threads.describe()


def test_auto_waits_for_a_front_end_and_the_host(two_threads):
    threads = StepThreads("auto", host=True)
    threads.apply(1)
    assert torch.get_num_threads() == 2 and not threads.enabled
    threads.front_end = True
    threads.apply(1)
    assert torch.get_num_threads() == 1
    assert not StepThreads("on", host=False).enabled  # an accelerator, or tensor-parallel ranks
    off = StepThreads("off", host=True)
    off.front_end = True
    assert not off.enabled


def test_one_thread_stays_one():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        StepThreads("on", host=True).apply(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_option_is_checked():
    with pytest.raises(ConfigError, match="front_end_core must be one of auto, on, off"):
        PlatformConfig(front_end_core="sometimes")


def test_the_async_engine_is_a_front_end(default_tokenizer):
    from vriksha import LLM

    model = tiny_model("llama", len(default_tokenizer))
    with LLM.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01) as llm:
        assert not llm.engine.step_threads.enabled  # offline generate keeps every thread
        served = AsyncEngine(llm.engine)
        assert served.engine.step_threads.enabled


def test_outputs_do_not_depend_on_the_step_threads(default_tokenizer, two_threads):
    model = tiny_model("llama", len(default_tokenizer))
    plain, fewer = engines_over(model, default_tokenizer, front_end_core="on")
    with plain, fewer:
        assert_same_samples(plain, fewer, len(default_tokenizer), seed=3, n=2, atol=1e-4)
