"""The engine's public surface: add_requests validates all before adding any, abort_all, the protocol a server
types against."""

from __future__ import annotations

import pytest

from tests.engine.conftest import tiny_model
from vriksha import SamplingParams
from vriksha.engine.core.async_engine import AsyncEngine
from vriksha.engine.core.llm_engine import LLMEngine
from vriksha.engine.core.protocol import EngineProtocol
from vriksha.errors import InvalidRequestError, PromptTooLongError

VOCAB = 512
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(default_tokenizer):
    engine = LLMEngine.from_module(
        tiny_model("llama", VOCAB), default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=64
    )
    yield engine
    engine.close()


def run(engine: LLMEngine) -> dict:
    done = {}
    for _ in range(200):
        if not engine.has_unfinished:
            break
        for out in engine.step():
            done[out.request_id] = out
    return done


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({"prompt_token_ids": []}, InvalidRequestError, "empty"),
        ({"prompt_token_ids": [1] * 80}, PromptTooLongError, "context"),
        ([VOCAB + 1], InvalidRequestError, "vocabulary"),
        (3.5, InvalidRequestError, "a prompt must be"),
    ],
)
def test_one_bad_request_adds_none(engine, bad, error, match):
    with pytest.raises(error, match=match):
        engine.add_requests([[1, 2, 3], bad, [4, 5]], PARAMS)
    assert engine.request_ids == [] and not engine.has_unfinished


def test_duplicate_ids_and_mismatched_lengths_add_none(engine):
    with pytest.raises(InvalidRequestError, match="'a' is already in use"):
        engine.add_requests([[1, 2], [3, 4]], PARAMS, request_ids=["a", "a"])
    with pytest.raises(InvalidRequestError, match="one of each per prompt"):
        engine.add_requests([[1, 2], [3, 4]], [PARAMS])
    assert engine.request_ids == []
    engine.add_request([1, 2], PARAMS, request_id="b")
    with pytest.raises(InvalidRequestError, match="'b' is already in use"):
        engine.add_requests([[5, 6], [7, 8]], PARAMS, request_ids=[None, "b"])
    assert engine.request_ids == ["b"]
    assert engine.abort_all() == ["b"] and not engine.has_unfinished


def test_add_requests_runs_each_with_its_own_params_and_keeps_the_text(engine):
    ids = engine.add_requests(["a b c", [7, 8, 9]], [PARAMS, SamplingParams(temperature=0, max_tokens=2)])
    assert len(set(ids)) == 2 and engine.request_ids == ids
    done = run(engine)
    assert [len(done[i].outputs[0].token_ids) for i in ids] == [4, 2]
    assert done[ids[0]].prompt == "a b c" and done[ids[1]].prompt is None


def test_abort_all_frees_every_slot(engine):
    ids = engine.add_requests([[1, 2, 3]] * 3, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    assert sorted(engine.abort_all()) == sorted(ids)
    assert not engine.has_unfinished and engine.request_ids == []
    free = engine.allocator.free_slot_set()
    assert len(free) + len(engine.cache.slot_set()) == engine.allocator.capacity


def test_the_async_engine_is_what_a_server_types_against(engine):
    assert isinstance(AsyncEngine(engine), EngineProtocol)
    assert not isinstance(engine, EngineProtocol)  # the sync core is not a serving engine
