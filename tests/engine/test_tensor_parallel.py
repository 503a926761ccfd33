"""Tensor-parallel serving: the engine on 2 ranks gives one rank's tokens; bad degrees and a dying rank fail
with errors that say what happened, and nothing is left running."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.engine.conftest import tiny_model
from tests.tiny_llama import embedded_tokenizer, save_model_dir
from vriksha import LLM, SamplingParams
from vriksha.engine.tensor_parallel import TensorParallelError
from vriksha.errors import ConfigError, InvalidRequestError

VOCAB = 512
# float32: the partial sums of a row-parallel layer round as one rank's matmul does only to ~1e-6
OPTIONS = dict(
    dtype="float32",
    chunked_prefill_size=8,
    max_num_batched_tokens=24,
    kv_cache_memory_gb=0.01,
    max_model_len=256,
)
# 1, 9 and 30 tokens (prefills over several chunks), then the 30 again behind a new suffix (a cached prefix)
PROMPTS = [{"prompt_token_ids": [(7 * i + k) % VOCAB for i in range(k)]} for k in (1, 9, 30)]
PROMPTS.append({"prompt_token_ids": PROMPTS[2]["prompt_token_ids"] + [5, 6, 7]})


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    tok = embedded_tokenizer()
    return {
        family: save_model_dir(tiny_model(family, VOCAB), tok, tmp_path_factory.mktemp(f"tiny-{family}"))
        for family in ("llama", "qwen2", "qwen3")
    }


def _run(llm: LLM) -> list:
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1)
    sampled = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=3)
    first = llm.generate(PROMPTS[:3], greedy)
    return first + llm.generate(PROMPTS[3:], greedy) + llm.generate(PROMPTS[1:2], sampled)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])  # tied head; q/k/v biases; per-head q/k norms
def test_two_ranks_give_one_ranks_tokens(model_dirs, family):
    path = str(model_dirs[family])
    with LLM(path, **OPTIONS) as one:
        expected = _run(one)
    with LLM(path, tensor_parallel_size=2, **OPTIONS) as tp:
        assert tp.engine.pool.k[0].shape[1] == 1  # 2 KV heads over 2 ranks: one each
        got = _run(tp)
        assert got[3].num_cached_tokens > 0  # the last greedy prompt reused the cached 30 tokens
        procs = tp.engine.tensor_parallel.procs
    for x, y in zip(expected, got, strict=True):
        assert y.outputs[0].token_ids == x.outputs[0].token_ids
        assert y.outputs[0].token_logprobs == pytest.approx(x.outputs[0].token_logprobs, abs=1e-4)
    assert all(p.poll() is not None for p in procs)  # close() stopped the other rank


def test_degree_not_dividing_the_heads_is_refused(model_dirs):
    started = time.monotonic()
    with pytest.raises(
        ConfigError, match=r"tensor_parallel_size 3 .* attention heads \(4\) and KV heads \(2\)"
    ):
        LLM(str(model_dirs["llama"]), tensor_parallel_size=3, **OPTIONS)
    assert time.monotonic() - started < 30  # refused before any rank is started


def test_embedded_model_names_the_degrees_it_takes():
    with pytest.raises(ConfigError, match=r"9.*3.*splits over 1, 3 ranks"):
        LLM(tensor_parallel_size=2)


def test_a_process_in_a_group_is_refused(model_dirs):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match="already belongs to one"):
            LLM(str(model_dirs["llama"]), tensor_parallel_size=2, **OPTIONS)
    finally:
        dist.destroy_process_group()


def test_module_cannot_be_split():
    with pytest.raises(InvalidRequestError, match="model path"):
        LLM.from_module(tiny_model("llama", VOCAB), embedded_tokenizer(), tensor_parallel_size=2)


@pytest.mark.slow
def test_a_rank_killed_mid_generation_fails_the_call_and_stops_the_engine(model_dirs):
    llm = LLM(str(model_dirs["llama"]), tensor_parallel_size=2, **OPTIONS)
    group = llm.engine.tensor_parallel
    worker = group.procs[0]
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    try:
        stream = llm.stream(PROMPTS[2], params)
        next(stream)
        os.kill(worker.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
            for _ in stream:
                pass
        assert time.monotonic() - started < 30
        with pytest.raises(TensorParallelError):  # every later call fails the same way, at once
            llm.generate(PROMPTS[:1], params)
    finally:
        llm.close()
    assert worker.poll() is not None


@pytest.mark.slow
def test_a_failure_in_rank_0s_forward_stops_every_rank(model_dirs):
    """Rank 0 fails after the other rank has the step: that rank waits in a collective, so it is stopped."""
    llm = LLM(str(model_dirs["llama"]), tensor_parallel_size=2, **OPTIONS)
    worker = llm.engine.tensor_parallel.procs[0]

    def broken(*args):
        raise RuntimeError("out of memory (simulated)")

    try:
        llm.engine.runner.run = broken
        started = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"rank 0 failed .*out of memory \(simulated\)"):
            llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4))
        assert time.monotonic() - started < 30
        assert worker.poll() is not None
    finally:
        llm.close()


@pytest.mark.slow
def test_embedded_model_on_three_ranks_gives_one_ranks_tokens(monkeypatch):
    """9 attention heads over 3 KV heads: 3 ranks, 3 heads and 1 KV head each. With the default options (one
    rank serves the GGUF's packed blocks, the ranks their dense shards) both compute the dequantized model's
    numbers: the same greedy tokens, log-probs within 1e-3."""
    from tests.engine.test_parity_default import RAW

    monkeypatch.delenv("VRIKSHA_DTYPE", raising=False)  # the defaults as a user gets them
    params = SamplingParams(temperature=0, max_tokens=8)
    options = dict(kv_cache_memory_gb=0.02, max_model_len=512)
    with LLM(**options) as one:
        expected = one.generate(RAW, params)
    with LLM(tensor_parallel_size=3, **options) as tp:
        got = tp.generate(RAW, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    for a, b in zip(got, expected, strict=True):
        diff = max(
            abs(x - y) for x, y in zip(a.outputs[0].token_logprobs, b.outputs[0].token_logprobs, strict=True)
        )
        assert diff <= 1e-3, f"log-probs on three ranks {diff:.2e} from one rank's"
