"""Short prefill chunks attended as decode rows (one row per prompt token, each over its own request's K/V up
to its position) compute what the prefill path computes, and which chunks qualify."""

import pytest
import torch

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.core.batch import ForwardBatch, PrefillChunk
from vriksha.engine.core.request import Request
from vriksha.engine.runner.native_decode import NativeDecode
from vriksha.engine.runner.step_builder import CHUNK_DECODE_ROWS_MAX_READS, StepBuilder


@pytest.fixture(scope="module")
def engine(default_tokenizer):
    return LLM.from_module(
        tiny_model("llama", 512), default_tokenizer, **ENGINE_TEST_OPTIONS, kv_cache_dtype="float32"
    )


def _outputs(llm, prompts, params):
    return [(o.outputs[0].token_ids, o.outputs[0].token_logprobs) for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_decode_rows_equal_the_prefill_path(default_tokenizer, kernels, monkeypatch):
    """Same tokens and log-probs (fp32 pool) with the conversion on and off, on the native kernels and on torch's;
    the prompts repeat so that the second round finds them cached but for their last token."""
    llm = LLM.from_module(
        tiny_model("qwen3", 512),
        default_tokenizer,
        **ENGINE_TEST_OPTIONS,
        kv_cache_dtype="float32",
        kernels=kernels,
    )
    g = torch.Generator().manual_seed(0)
    prompts = [
        {"prompt_token_ids": torch.randint(0, 512, (k,), generator=g).tolist()} for k in (1, 5, 17, 40)
    ]
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=3, logprobs=1)
    converted = [_outputs(llm, prompts, params) for _ in range(2)]
    llm.engine.flush_cache()
    monkeypatch.setattr(StepBuilder, "chunks_as_decode_rows", lambda self, batch: False)
    plain = [_outputs(llm, prompts, params) for _ in range(2)]
    for got, want in zip(converted, plain, strict=True):
        for (ids, lps), (ids2, lps2) in zip(got, want, strict=True):
            assert ids == ids2
            assert lps == pytest.approx(lps2, abs=1e-5)


def _batch(decodes: int, chunks: list[tuple[int, int]], drafts: bool = False) -> ForwardBatch:
    req = Request.__new__(Request)
    batch = ForwardBatch(decodes=[req] * decodes, prefills=[PrefillChunk(req, s, e, True) for s, e in chunks])
    if drafts:
        batch.drafts = [object()]
    return batch


def test_which_chunks_qualify(engine):
    runner = engine.engine.runner
    as_rows = runner.builder.chunks_as_decode_rows
    assert not as_rows(_batch(4, []))  # nothing to convert
    assert as_rows(_batch(4, [(4999, 5000)]))  # a cached prompt's last token, however long the prompt
    assert as_rows(_batch(0, [(0, 13), (20, 33)]))  # short turns over short histories
    native = runner.path(NativeDecode)
    limit = native.max_batch if native is not None else 64
    assert not as_rows(_batch(limit, [(10, 11)]))  # one row more than a native step takes
    assert not as_rows(_batch(0, [(300, 316)]))  # 16 rows over 300 cached positions each
    n = 40  # a fresh prompt of n tokens reads n (n + 1) / 2 positions
    assert (n * (n + 1) // 2 <= CHUNK_DECODE_ROWS_MAX_READS) == as_rows(_batch(0, [(0, n)]))
    assert not as_rows(_batch(1, [(9, 10)], drafts=True))  # draft runs keep the prefill path
