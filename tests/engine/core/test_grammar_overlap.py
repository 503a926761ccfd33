"""Grammar masks computed ahead (step t+1's while step t's forward runs, `grammar_overlap`): the same tokens as
masks computed just before sampling, also when a request finishes or is aborted while its next mask is being
computed; a token outside the grammar is rejected; sequences in one state share one computed mask."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha import LLM, SamplingParams
from vriksha.engine.config import PlatformConfig
from vriksha.engine.core.grammar import CPU_OVERLAP_MIN_BATCH, GrammarEngine, overlap_plan
from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.errors import ConfigError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}
SO = StructuredOutputsParams(json=SCHEMA)
PROMPTS = ["Hello there, how are you", "Write a JSON object", "One two three", "Tell me about Paris"]


@pytest.fixture(scope="module")
def llms():
    tok = embedded_tokenizer()
    out = {}
    for mode in ("off", "on"):
        model = tiny_llama(tok, initializer_range=0.2).eval()
        out[mode] = LLM.from_module(
            model, tok, max_model_len=512, kv_cache_memory_gb=0.05, grammar_overlap=mode
        )
    yield out
    for llm in out.values():
        llm.close()


@pytest.fixture(scope="module")
def grammar():
    tok = embedded_tokenizer()
    eng = GrammarEngine(tok, len(tok), frozenset({tok.eos_token_id}), overlap=True, threads=1)
    yield eng
    eng.close()


def _tokens(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def _alone(engine: GrammarEngine, matcher) -> torch.Tensor:
    buf = torch.full((1, engine.words), -1, dtype=torch.int32)
    engine.executor.unsafe_compute_mask_ptr([(matcher.inner, 0)], buf.data_ptr(), engine.words * 4, 1)
    return buf[0]


def test_the_option_chooses_the_mode():
    assert overlap_plan("off", on_host=False) == (False, None, 1)
    assert overlap_plan("auto", on_host=False) == (True, None, 1)
    assert overlap_plan("off", on_host=True) == (False, None, 1)
    assert overlap_plan("on", on_host=True)[0] is True and overlap_plan("on", on_host=True)[2] == 1
    spare = len(__import__("os").sched_getaffinity(0)) - torch.get_num_threads()
    expected = (True, spare, 1) if spare >= 1 else (True, 1, CPU_OVERLAP_MIN_BATCH)
    assert overlap_plan("auto", on_host=True) == expected
    with pytest.raises(ConfigError, match="grammar_overlap"):
        PlatformConfig(grammar_overlap="sometimes")


def test_overlap_changes_no_token(llms):
    assert llms["on"].engine.grammar_engine().overlap and not llms["off"].engine.grammar_engine().overlap
    # greedy and seeded sampling; lengths that end some sequences while the others still run
    params = [
        SamplingParams(temperature=0, max_tokens=40, structured_outputs=SO),
        SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=60, structured_outputs=SO),
        SamplingParams(temperature=0, max_tokens=7, structured_outputs=SO),
        SamplingParams(temperature=0.8, seed=5, max_tokens=60),  # unconstrained, in the same batch
    ]
    got = {mode: llm.generate(PROMPTS, params) for mode, llm in llms.items()}
    assert _tokens(got["on"]) == _tokens(got["off"])
    finished_by_grammar = [c.text for c in got["on"][1].outputs if c.finish_reason == "stop"]
    for text in finished_by_grammar:
        assert set(json.loads(text)) == {"name", "n", "tags"}


def test_a_request_aborted_or_finished_with_its_next_mask_in_flight(llms):
    engine = llms["on"].engine
    long = SamplingParams(temperature=0, max_tokens=30, structured_outputs=SO)
    engine.add_request(
        PROMPTS[0], SamplingParams(temperature=0, max_tokens=30, structured_outputs=SO), "drop"
    )
    engine.add_request(
        PROMPTS[1], SamplingParams(temperature=0, max_tokens=3, structured_outputs=SO), "short"
    )
    engine.add_request(PROMPTS[2], long, "keep")
    outputs = {}
    for step in range(200):
        if not engine.has_unfinished:
            break
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        if step == 2:
            dropped = next(r for g in [engine._groups["drop"]] for r in g.sequences)
            assert dropped.grammar.pending is not None  # its next mask was started after this step
            assert engine.abort("drop")
    assert not engine.has_unfinished and "drop" not in outputs
    assert len(outputs["short"].outputs[0].token_ids) == 3
    alone = llms["off"].generate([PROMPTS[2]], long)[0]
    assert outputs["keep"].outputs[0].token_ids == alone.outputs[0].token_ids


def test_a_token_outside_the_grammar_is_rejected(grammar, default_tokenizer):
    bad, good = grammar.matcher(SO), grammar.matcher(SO)
    start = _alone(grammar, good)
    outside = next(t for t in range(len(default_tokenizer)) if not (start[t // 32] >> (t % 32)) & 1)
    assert not bad.advance(outside)
    assert bad.error and not bad.live
    token = default_tokenizer.encode("{", add_special_tokens=False)[0]
    assert good.advance(token)
    grammar.prefetch([bad, good])  # the rejected sequence is left out
    assert bad.pending is None and good.pending is not None
    masks = grammar.masks([bad, good])
    assert torch.equal(masks[1], _alone(grammar, good))


def test_sequences_in_one_state_share_a_computed_mask(grammar, default_tokenizer):
    text_ids = default_tokenizer.encode('{"name": "ab', add_special_tokens=False)
    fresh = GrammarEngine(
        default_tokenizer, len(default_tokenizer), frozenset({default_tokenizer.eos_token_id})
    )
    try:
        matchers = [fresh.matcher(SO) for _ in range(4)]
        first = fresh.masks(matchers)  # four in the start state: one computed
        assert fresh.computed == 1
        for m in matchers[:3]:
            for t in text_ids:
                assert m.advance(t)
        masks = fresh.masks(matchers)  # three in one state, one still at the start (cached)
        assert fresh.computed == 2
        for i, m in enumerate(matchers):
            assert torch.equal(masks[i], _alone(fresh, m))
        assert torch.equal(masks[3], first[0]) and not torch.equal(masks[0], first[0])
        again = fresh.masks([fresh.matcher(SO)])  # a new request of the spec: its start mask is cached
        assert fresh.computed == 2 and torch.equal(again[0], first[0])
    finally:
        fresh.close()


def test_steps_below_min_batch_compute_their_masks_when_sampled(default_tokenizer):
    engine = GrammarEngine(
        default_tokenizer,
        len(default_tokenizer),
        frozenset({default_tokenizer.eos_token_id}),
        overlap=True,
        threads=1,
        min_batch=3,
    )
    try:
        token = default_tokenizer.encode("{", add_special_tokens=False)[0]
        few = [engine.matcher(SO) for _ in range(2)]
        many = [engine.matcher(SO) for _ in range(3)]
        for m in few + many:
            assert m.advance(token)
        engine.prefetch(few)
        assert all(m.pending is None for m in few)  # two: left for sampling time
        engine.prefetch(many)
        assert all(m.pending is not None for m in many)  # three: started at once
        for group in (few, many):
            masks = engine.masks(group)
            for i, m in enumerate(group):
                assert torch.equal(masks[i], _alone(engine, m))
    finally:
        engine.close()
