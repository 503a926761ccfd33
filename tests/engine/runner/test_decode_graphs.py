"""Decode steps through the static, padded buffers of the CUDA-graph path give the outputs of ordinary steps.

On a CPU the buffers and padding run eagerly (`capture=False`): everything but the capture itself. The
CUDA tests capture and replay for real and are skipped without a CUDA device.
"""

import copy
from types import SimpleNamespace

import pytest
import torch

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.config import PlatformConfig
from vriksha.engine.core.batch import ForwardBatch
from vriksha.engine.runner.decode_graphs import DecodeGraphs, capture_sizes
from vriksha.engine.runner.step import ForwardStep
from vriksha.errors import ConfigError

VOCAB = 512
OPTIONS = {**ENGINE_TEST_OPTIONS, "max_num_batched_tokens": 64}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def _with_eager_graphs(llm: LLM, max_batch: int) -> list[int]:
    """Route the engine's decode-only steps through eager static buffers; returns the list of batch sizes
    that took them, appended to as steps run."""
    runner = llm.engine.runner
    graphs = DecodeGraphs(
        runner.run,
        runner.model,
        runner.pool,
        runner.table.table,
        runner.attention,
        max_batch,
        capture=False,
    )
    taken: list[int] = []
    forward = graphs.forward

    def counted(batch: ForwardBatch) -> torch.Tensor:
        taken.append(len(batch.decodes))
        return forward(batch)

    graphs.forward = counted
    runner.paths.insert(0, graphs)
    return taken


def _prompts(count: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (count,), generator=g).tolist()
    return [{"prompt_token_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()} for n in lengths]


@pytest.mark.parametrize("native_decode", ["off", "auto"])
@pytest.mark.parametrize("family", ["llama", "qwen2-sliding", "gemma"])
def test_padded_static_steps_equal_ordinary_steps(family, native_decode, default_tokenizer):
    """Three and five requests pad to four and eight rows (scratch-slot padding), requests finish at different
    steps so the batch shrinks across sizes, and the stale slot columns of finished rows stay behind."""
    model = tiny_model(family, VOCAB)
    plain = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS, native_decode=native_decode)
    padded = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS, native_decode=native_decode)
    taken = _with_eager_graphs(padded, max_batch=8)
    for count, seed in ((3, 1), (5, 2)):
        prompts = _prompts(count, seed)
        params = [
            SamplingParams(temperature=0, max_tokens=6 + 5 * i, ignore_eos=True, logprobs=1)
            for i in range(count)
        ]
        want = plain.generate(prompts, params)
        got = padded.generate(prompts, params)
        for x, y in zip(want, got, strict=True):
            assert x.outputs[0].token_ids == y.outputs[0].token_ids
            assert x.outputs[0].token_logprobs == pytest.approx(y.outputs[0].token_logprobs, abs=1e-4)
    assert {3, 5} <= set(taken) and 1 in taken, taken  # padded sizes and the shrinking tail took the path


def test_a_gathering_decode_attention_masks_the_stale_columns(default_tokenizer):
    """The torch set gathers every column of the slot buffer (what `--cuda-graphs on` captures with it):
    columns past a row's length, left by longer requests before, are masked out."""
    model = tiny_model("llama", VOCAB)
    plain = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS, kernels="torch")
    padded = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS, kernels="torch")
    assert padded.engine.runner.attention.decode_kernel is None
    taken = _with_eager_graphs(padded, max_batch=8)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    for count, seed in ((4, 6), (2, 7)):  # long rows first, then short ones over their stale columns
        prompts = _prompts(count, seed)
        for x, y in zip(plain.generate(prompts, params), padded.generate(prompts, params), strict=True):
            assert x.outputs[0].token_ids == y.outputs[0].token_ids
            assert x.outputs[0].token_logprobs == pytest.approx(y.outputs[0].token_logprobs, abs=1e-4)
    assert {4, 2} <= set(taken), taken


def test_seeded_sampling_and_batches_past_the_largest_size(default_tokenizer):
    model = tiny_model("llama", VOCAB)
    plain = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS)
    padded = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS)
    taken = _with_eager_graphs(padded, max_batch=4)
    prompts = _prompts(6, 3)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=7, logprobs=2)
    for x, y in zip(plain.generate(prompts, params), padded.generate(prompts, params), strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    assert taken and max(taken) <= 4  # six running requests decode through the ordinary step


def test_padding_rows_write_only_the_scratch_slot(default_tokenizer):
    """A smaller batch after a larger one: its padding rows must not replay the larger batch's rows, whose
    slots may belong to other requests by then."""
    from types import SimpleNamespace

    llm = LLM.from_module(tiny_model("llama", VOCAB), default_tokenizer, **OPTIONS)
    _with_eager_graphs(llm, max_batch=8)
    runner = llm.engine.runner
    graphs, pool = runner.path(DecodeGraphs), runner.pool
    context = 10
    for row in range(1, 6):
        runner.table.table[row, :context] = torch.arange(context) + 1 + row * context

    def batch(rows: range) -> ForwardBatch:
        g = torch.Generator().manual_seed(len(rows))
        requests = [
            SimpleNamespace(
                row=r,
                num_computed=context - 1,
                all_token_ids=torch.randint(0, VOCAB, (context,), generator=g).tolist(),
            )
            for r in rows
        ]
        return ForwardBatch(decodes=requests, prefills=[])

    graphs.forward(batch(range(1, 6)))  # five rows, padded to eight
    for cache in (*pool.k, *pool.v):
        cache.zero_()
    graphs.forward(batch(range(1, 4)))  # three rows, padded to four
    written = {0} | {1 + r * context + context - 1 for r in range(1, 4)}
    for cache in (*pool.k, *pool.v):
        touched = set(cache.flatten(1).abs().sum(1).nonzero().flatten().tolist())
        assert touched <= written and touched - {0}, touched


def test_only_decode_only_batches_within_the_largest_size_take_the_path(default_tokenizer):
    llm = LLM.from_module(tiny_model("llama", VOCAB), default_tokenizer, **OPTIONS)
    _with_eager_graphs(llm, max_batch=8)
    graphs = llm.engine.runner.path(DecodeGraphs)
    request = SimpleNamespace(lora_id=0)  # `accepts` looks at the batch's shape and its adapters only

    def step(**batch) -> ForwardStep:
        return ForwardStep(ForwardBatch(**batch), build=lambda b: None)  # never built

    assert graphs.accepts(step(decodes=[request] * 8, prefills=[]))
    assert not graphs.accepts(step(decodes=[request] * 9, prefills=[]))
    assert not graphs.accepts(step(decodes=[], prefills=[]))
    assert not graphs.accepts(step(decodes=[request], prefills=[request]))
    assert not graphs.accepts(step(decodes=[request], prefills=[], drafts=[request]))


def test_speculative_steps_mixed_with_padded_ones(default_tokenizer):
    """Under n-gram speculation, steps with draft runs take the ordinary path and the others the padded one."""
    model = tiny_model("llama", VOCAB)
    plain = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS, speculative="ngram")
    padded = LLM.from_module(copy.deepcopy(model), default_tokenizer, **OPTIONS, speculative="ngram")
    taken = _with_eager_graphs(padded, max_batch=8)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8] * 6}, *_prompts(2, 5)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    a = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    b = [o.outputs[0].token_ids for o in padded.generate(prompts, params)]
    assert a == b
    assert taken


def test_choice_on_the_cpu_and_bad_values(default_tokenizer):
    llm = LLM.from_module(tiny_model("llama", VOCAB), default_tokenizer, **OPTIONS)
    runner = llm.engine.runner
    assert runner.path(DecodeGraphs) is None
    assert runner.decode_graphs_choice == "off: CUDA graphs need a CUDA device"
    off = LLM.from_module(tiny_model("llama", VOCAB), default_tokenizer, **OPTIONS, cuda_graphs="off")
    assert off.engine.runner.decode_graphs_choice == "off"
    with pytest.raises(ConfigError, match="cuda_graphs must be one of auto, on, off"):
        PlatformConfig(cuda_graphs="always")
    with pytest.raises(ConfigError, match="cuda_graph_max_batch must be a positive integer"):
        PlatformConfig(cuda_graph_max_batch=0)


def _cuda_pair(family: str, **options):
    from vriksha.loading import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(None))
    model = tiny_model(family, VOCAB).to("cuda")  # fp32: a padded batch may sum in another order, not round
    common = dict(OPTIONS, kv_cache_memory_gb=0.05, device="cuda", cuda_graph_max_batch=8, **options)
    graphs = LLM.from_module(copy.deepcopy(model), tokenizer, cuda_graphs="on", **common)
    eager = LLM.from_module(copy.deepcopy(model), tokenizer, cuda_graphs="off", **common)
    return graphs, eager


@needs_cuda
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cuda_graphs_replay_the_eager_steps(family):
    graphs, eager = _cuda_pair(family)
    runner = graphs.engine.runner
    assert runner.path(DecodeGraphs) is not None and runner.path(DecodeGraphs).graphs, (
        runner.decode_graphs_choice
    )
    for count, seed in ((1, 1), (3, 2), (7, 3)):
        prompts = _prompts(count, seed)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        a = [o.outputs[0].token_ids for o in graphs.generate(prompts, params)]
        b = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
        assert a == b


@needs_cuda
def test_cuda_graphs_follow_weights_moved_to_new_memory():
    graphs, eager = _cuda_pair("llama")
    runner = graphs.engine.runner
    captured = dict(runner.path(DecodeGraphs).graphs)
    with torch.no_grad():
        for llm in (graphs, eager):
            for p in llm.engine.runner.model.parameters():
                p.data = p.data * 1.5  # new storage: the captured graphs would read the old weights
            llm.engine.weights_updated()
    assert all(runner.path(DecodeGraphs).graphs[b] is not captured[b] for b in captured)
    prompts = _prompts(3, 4)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    a = [o.outputs[0].token_ids for o in graphs.generate(prompts, params)]
    b = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    assert a == b
