"""The engine times its steps by kind (decode, prefill, verify), the histogram the server's /metrics shows."""

from __future__ import annotations

import pytest

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.core.stats import STEP_BUCKETS, StepTimes


def test_step_times_bucket_and_quantile():
    times = StepTimes()
    assert times.quantile("decode", 0.5) is None
    for seconds in (0.001, 0.003, 0.003, 0.009, 99.0):
        times.observe("decode", seconds)
    counts = times.counts["decode"]
    assert counts[0] == 1 and counts[STEP_BUCKETS.index(0.004)] == 2 and counts[-1] == 1
    assert times.count("decode") == 5 and times.count("prefill") == 0
    assert times.sums["decode"] == pytest.approx(99.016)
    assert times.quantile("decode", 0.5) == 0.004
    assert times.quantile("decode", 0.8) == 0.01
    assert times.quantile("decode", 1.0) == float("inf")
    snapshot = times.copy()
    times.observe("decode", 0.001)
    assert snapshot.count("decode") == 5  # a copy, not a view


def test_engine_counts_its_steps_by_kind(default_tokenizer):
    model = tiny_model("llama", len(default_tokenizer))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(5, 25))}  # 20 tokens: three chunks of at most 8
    with LLM.from_module(model, default_tokenizer, **ENGINE_TEST_OPTIONS) as llm:
        llm.generate(prompt, params)
        times = llm.engine.stats().step_times
    assert times.count("prefill") == 3  # the last chunk samples the first token
    assert times.count("decode") == 5
    assert times.count("verify") == 0
    assert times.sums["decode"] > 0


def test_steps_since_an_earlier_copy():
    times = StepTimes()
    times.observe("prefill", 0.03)
    before = times.copy()
    times.observe("prefill", 0.01)
    times.observe("decode", 0.005)
    later = times.since(before)
    assert later.count("prefill") == 1 and later.count("decode") == 1
    assert later.mean("prefill") == pytest.approx(0.01) and later.mean("verify") is None
