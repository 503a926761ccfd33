"""The one delta loop of the streaming endpoints: what each cumulative output adds, reported once."""

from __future__ import annotations

from vriksha.engine.core.outputs import CompletionOutput
from vriksha.server.deltas import DeltaTracker, text_delta


def out(text: str, tokens: list[int], finish: str | None = None) -> CompletionOutput:
    return CompletionOutput(0, text, tokens, [0.0] * len(tokens), None, finish)


def test_deltas_add_up_to_the_final_output_and_a_finished_choice_is_reported_once():
    steps = [out("He", [1]), out("He", [1]), out("Hel\ufffd", [1, 2]), out("Hello", [1, 2, 3], "stop")]
    tracker = DeltaTracker()
    deltas = [tracker.advance(0, s) for s in steps]
    assert deltas[1] is None  # nothing new
    sent = [d for d in deltas if d is not None]
    assert [d.text for d in sent] == ["He", "l", "lo"]  # the cut character waits for the next token
    assert [d.token_ids for d in sent] == [[1], [2], [3]] and [d.text_start for d in sent] == [0, 2, 3]
    assert sent[-1].finish_reason == "stop"
    assert tracker.advance(0, steps[-1]) is None
    assert tracker.advance(1, steps[0]).text == "He"  # choices are tracked apart


def test_a_finish_without_new_text_is_still_sent_and_a_cut_stop_string_sends_nothing_back():
    tracker = DeltaTracker()
    assert tracker.advance(0, out("abc EN", [1, 2])).text == "abc EN"
    final = tracker.advance(0, out("abc ", [1, 2, 3], "stop"))  # the stop string "END" is cut from the text
    assert final is not None and final.text == "" and final.token_ids == [3]
    assert text_delta("ab\ufffd", 0, finished=True) == "ab\ufffd"
