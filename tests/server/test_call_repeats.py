"""The reply of `tool_choice: "required"` with parallel calls ends where the model repeats a call (fast: the text
rules alone; the clients' view of it is in test_tool_choice_clients.py)."""

from __future__ import annotations

import json

from vriksha.engine.outputs import CompletionOutput
from vriksha.server.call_repeats import REPEATED, RepeatGuard, shown
from vriksha.server.protocol import ChatCompletionRequest
from vriksha.server.tools import forced_call_grammar, plan_tools
from vriksha.toolcalls import get_parser

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {}}}},
}
HERMES = get_parser("hermes", [WEATHER])
DELIMS = {"get_weather": HERMES.call_delimiters("get_weather")}


def call(city: str) -> str:
    opening, closing = DELIMS["get_weather"]
    return opening + json.dumps({"city": city}) + closing


def test_distinct_calls_are_all_shown():
    text = call("Paris") + "\n" + call("London")
    assert shown(text, DELIMS).end == len(text) and not shown(text, DELIMS).repeated


def test_a_repeated_call_ends_the_reply_before_it():
    first = call("Paris") + "\n" + call("London")
    s = shown(first + "\n" + call("Paris") + "\n" + call("Rome"), DELIMS)
    assert s.repeated and s.end == len(first)


def test_text_that_could_still_become_a_repeat_is_held_back():
    paris = call("Paris")
    for partial in ("\n", "\n<tool_", "\n" + paris[:-3]):
        s = shown(paris + partial, DELIMS)
        assert s == type(s)(len(paris), False), partial
    diverged = paris + "\n" + call("London")[:-16]  # up to `"London`
    assert shown(diverged, DELIMS).end == len(diverged)


def test_a_call_cut_inside_its_arguments_is_not_complete():
    opening, _ = DELIMS["get_weather"]
    text = call("Paris") + "\n" + opening + '{"city": "Paris"'
    assert shown(text, DELIMS) == type(shown(text, DELIMS))(len(call("Paris")), False)


def _plan(choice, parallel=None):
    req = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER],
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )
    return plan_tools(req, "hermes")


def test_the_guard_finishes_a_running_choice_at_its_repeat():
    guard = RepeatGuard(_plan("required"))
    text = call("Paris") + "\n" + call("Paris") + "\n<tool"
    c = CompletionOutput(0, text, [1, 2, 3], [0.0] * 3, None, None)
    seen = guard.view(c)
    assert (seen.text, seen.finish_reason, seen.stop_reason) == (call("Paris"), "stop", REPEATED)


def test_a_named_function_is_called_exactly_once():
    """The grammar of a named choice admits one call, also where parallel calls are allowed (as vLLM)."""
    named = forced_call_grammar(_plan({"type": "function", "function": {"name": "get_weather"}}))
    assert named.grammar.splitlines()[0] == "start: call"
    assert not RepeatGuard(_plan({"type": "function", "function": {"name": "get_weather"}})).active
    several = forced_call_grammar(_plan("required"))
    assert several.grammar.splitlines()[0] == 'start: call ("\\n" call)*'
    one = forced_call_grammar(_plan("required", parallel=False))
    assert one.grammar.splitlines()[0] == "start: call"
