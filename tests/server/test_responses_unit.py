"""/v1/responses pieces without a server: input items to chat messages, the streamed event sequence, the
store's bounds, and structured outputs after a reasoning block (checked with llguidance on the tokenizer)."""

from __future__ import annotations

import json

import pytest

from vriksha.reasoning import get_reasoning_parser
from vriksha.server.errors import BadRequestError
from vriksha.server.protocol_responses import ResponsesRequest
from vriksha.server.response_store import ResponseStore
from vriksha.server.responses_events import ResponseEvents
from vriksha.server.responses_items import chat_request, input_messages, items_as_messages, output_items
from vriksha.toolcalls import ContentDelta, ToolCallDelta


def test_a_string_is_one_user_message():
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


def test_items_become_the_chat_messages_of_a_tool_round_trip():
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add 2 and 3"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "call_id": "call_a", "name": "add", "arguments": '{"a":2,"b":3}'},
        {"type": "function_call", "call_id": "call_b", "name": "add", "arguments": '{"a":1,"b":1}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "5"},
        {"type": "function_call_output", "call_id": "call_b", "output": "2"},
    ]
    call = lambda i, a: {"id": i, "type": "function", "function": {"name": "add", "arguments": a}}  # noqa: E731
    assert input_messages(items) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [call("call_a", '{"a":2,"b":3}'), call("call_b", '{"a":1,"b":1}')],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "2"},
    ]


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"type": "input_image", "image_url": "x"}], "input[0].type"),
        ([{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0]"),
        ([{"role": "robot", "content": "x"}], "input[0].role"),
        ([{"type": "function_call_output", "output": "5"}], "input[0].call_id"),
        ([{"type": "function_call", "name": "f"}], "input[0]"),
    ],
)
def test_bad_items_are_a_400_naming_the_item(items, param):
    with pytest.raises(BadRequestError) as e:
        input_messages(items)
    assert e.value.param == param


def test_the_request_maps_onto_a_chat_request():
    req = ResponsesRequest(
        model="m",
        input="hi",
        instructions="you are terse",
        tools=[{"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": True}],
        tool_choice={"type": "function", "name": "add"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        max_output_tokens=7,
        temperature=0.5,
        top_p=0.9,
    )
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    chat, conversation = chat_request(req, history)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user"]
    assert conversation == [*history, {"role": "user", "content": "hi"}]  # instructions are not carried on
    assert chat.tools == [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    assert chat.tool_choice == {"type": "function", "function": {"name": "add"}}
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}},
    }
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p) == (7, 0.5, 0.9)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": []}, "input"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(fields, param):
    body = {"model": "m", "input": "hi", **fields}
    with pytest.raises(BadRequestError) as e:
        chat_request(ResponsesRequest(**body), [])
    assert e.value.param == param


def test_output_items_and_their_messages_for_a_follow_up():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    items = output_items("why", "so", calls)
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "why"}]
    assert items[1]["content"][0]["text"] == "so"
    assert items_as_messages(items) == [{"role": "assistant", "content": "so", "tool_calls": calls}]


def test_events_open_fill_and_close_each_item_in_order():
    ev = ResponseEvents()
    out = ev.pieces("thin", []) + ev.pieces("king", [ContentDelta("The "), ContentDelta("sum:")])
    out += ev.pieces("", [ToolCallDelta(0, "", "call_1", "add"), ToolCallDelta(0, '{"a": 1}')])
    out += ev.close()
    assert [e["type"] for e in out] == [
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["output_index"] for e in out if e["type"] == "response.output_item.done"] == [0, 1, 2]
    reasoning, message, call = ev.items
    assert reasoning["content"][0]["text"] == "thinking"
    assert message["content"][0]["text"] == "The sum:"
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "add", '{"a": 1}')
    deltas = [e for e in out if e["type"] == "response.output_text.delta"]
    assert {e["item_id"] for e in deltas} == {message["id"]}


def test_store_drops_the_least_recently_used_and_the_expired():
    now = [0.0]
    store = ResponseStore(2, ttl_s=10, clock=lambda: now[0])
    for rid in ("a", "b"):
        store.put({"id": rid}, [])
    assert store.get("a") is not None  # a is now the most recent
    store.put({"id": "c"}, [])
    assert store.get("b") is None and store.get("a") is not None
    now[0] = 5.0
    assert store.get("c") is not None  # renewed at 5
    now[0] = 12.0
    assert store.get("a") is None  # last used at 0
    assert store.get("c") is not None
    assert len(ResponseStore(0, 10)) == 0
    store.put({"id": "d"}, [], conversation_id="c")  # d continues c's conversation
    assert store.get("d").conversation_id == "c" and store.get("c").conversation_id == "c"


@pytest.fixture(scope="module")
def matcher_for():
    import llguidance as llg

    from tests.tiny_llama import embedded_tokenizer
    from vriksha.engine.core.grammar import grammar_text, llguidance_tokenizer

    tok = embedded_tokenizer()
    lt = llguidance_tokenizer(tok, len(tok), frozenset({tok.eos_token_id}))

    def accepts(spec, text: str) -> bool:
        m = llg.LLMatcher(lt, grammar_text(spec), log_level=0)
        return m.consume_tokens(tok.encode(text, add_special_tokens=False)) and m.is_accepting()

    return accepts


SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"a": 1}', True),
        ('<think>\nis it </thin 1?\n</think>\n\n{"a": 1}', True),
        ("<think>no answer after</think>", False),
        ('<think>a</think>more</think>{"a": 1}', False),  # the block ends at its first closing tag
        ('prose{"a": 1}', False),
    ],
)
def test_structured_outputs_apply_after_an_optional_reasoning_block(matcher_for, text, ok):
    from vriksha.engine.core.structured_outputs import StructuredOutputsParams
    from vriksha.server.reasoning import after_reasoning

    spec = after_reasoning(StructuredOutputsParams(json=SCHEMA), get_reasoning_parser("qwen3"))
    assert matcher_for(spec, text) is ok
    choice = after_reasoning(StructuredOutputsParams(choice=["yes", "no"]), get_reasoning_parser("qwen3"))
    assert matcher_for(choice, "<think>hmm</think> yes") and not matcher_for(
        choice, "<think>hmm</think> maybe"
    )


def test_a_block_the_prompt_opened_must_be_closed_before_the_answer(matcher_for):
    from vriksha.engine.core.structured_outputs import StructuredOutputsParams
    from vriksha.server.reasoning import after_reasoning

    spec = after_reasoning(
        StructuredOutputsParams(json=SCHEMA), get_reasoning_parser("deepseek_r1"), opened=True
    )
    assert matcher_for(spec, 'weighing</think>{"a": 2}')
    assert not matcher_for(spec, '{"a": 2}')
    assert json.dumps(SCHEMA) in spec.grammar or "%json" in spec.grammar
