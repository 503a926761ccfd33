"""The waiting queue is shared fairly among user requests: a request with many sequences (n, or a batch) does
not keep a small request waiting until all of its own have been admitted; requests of one sequence each keep
their order (first come, first served)."""

from __future__ import annotations

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.core.request import Request, Status
from vriksha.engine.core.scheduler import fair_order

VOCAB = 512
SEATS = 4


def test_a_small_request_waits_one_turn_not_behind_every_sequence_of_a_flood(default_tokenizer):
    llm = LLM.from_module(
        tiny_model("llama", VOCAB), default_tokenizer, max_model_len=128, kv_cache_memory_gb=0.01,
        max_num_seqs=SEATS,
    )  # fmt: skip
    engine = llm.engine
    flood_id = engine.add_request([1, 2, 3], SamplingParams(n=64, max_tokens=6, ignore_eos=True, seed=1))
    flood = engine._groups[flood_id].sequences
    for _ in range(3):
        engine.step()
    assert sum(s.status is Status.RUNNING for s in flood) == SEATS  # the flood holds every seat
    small_id = engine.add_request([4, 5, 6], SamplingParams(max_tokens=2, ignore_eos=True))
    done = False
    while not done:
        done = any(o.request_id == small_id and o.finished for o in engine.step())
    started = sum(s.status is not Status.WAITING for s in flood)
    assert started <= 2 * SEATS, (
        f"the small request waited for {started} of the flood's 64 sequences to start"
    )
    while engine.has_unfinished:
        engine.step()
    assert all(s.finish_reason == "length" for s in flood)


def _seq(rid: str, index: int = 0) -> Request:
    return Request(rid, index, [1, 2], SamplingParams(), frozenset())


def test_fair_order_interleaves_requests_and_keeps_single_sequences_in_order():
    singles = [_seq(str(i)) for i in range(5)]
    assert fair_order(singles, []) == singles
    flood = [_seq("f", i) for i in range(6)]
    small = _seq("s")
    running = [_seq("f", 90), _seq("f", 91)]
    order = fair_order([*flood, small], running)
    assert order[0] is small  # the flood already runs two sequences
    assert [r.index for r in order if r.request_id == "f"] == list(range(6))  # a request's own order is kept
    a, b = [_seq("a", i) for i in range(3)], [_seq("b", i) for i in range(3)]
    assert [(r.request_id, r.index) for r in fair_order([*a, *b], [])] == [
        ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)
    ]  # fmt: skip
