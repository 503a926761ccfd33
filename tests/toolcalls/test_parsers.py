"""The one tool-call parser: formats, edge cases, and streamed deltas that reassemble to the whole parse."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vriksha.errors import ConfigError
from vriksha.toolcalls import (
    ContentDelta,
    ToolCallDelta,
    assemble,
    get_parser,
    parse_tool_calls,
    parser_for_template,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "note", "parameters": {"properties": {"text": {"type": "string"}}}},
    },
]


def counter_ids():
    it = itertools.count()
    return lambda: f"call_{next(it)}"


def parse(name: str, text: str, tools=None):
    return get_parser(name, tools, counter_ids()).parse(text)


def stream_in_pieces(name: str, text: str, cuts: list[int], tools=None):
    s = get_parser(name, tools, counter_ids()).stream()
    deltas = []
    prev = 0
    for c in sorted(set(cuts)) + [len(text)]:
        deltas += s.feed(text[prev:c])
        prev = c
    deltas += s.finish()
    return deltas


def summary(result):
    content, calls = result
    return content, [(c.id, c.name, c.arguments_json, c.arguments, c.error is None) for c in calls]


def test_hermes_calls_and_content():
    text = (
        "Let me add.\n\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>\n'
        '<tool_call>{"arguments": {"text": "a } in \\"quotes\\" </tool"}, "name": "note"}</tool_call>\n'
    )
    content, calls = parse("hermes", text)
    assert content == "Let me add."
    assert [c.name for c in calls] == ["add", "note"]
    assert calls[0].arguments == {"a": 1, "b": 2.5}
    assert calls[0].arguments_json == '{"a": 1, "b": 2.5}'
    assert calls[1].arguments == {"text": 'a } in "quotes" </tool'}
    assert [c.id for c in calls] == ["call_0", "call_1"]


def test_text_between_calls_keeps_one_separator_and_plain_text_is_unchanged():
    content, calls = parse("hermes", 'Before.\n<tool_call>{"name": "f"}</tool_call>\n\nAfter. ')
    assert content == "Before.\nAfter."
    assert calls[0].arguments_json == "{}" and calls[0].arguments == {}
    plain = "  Just an answer,\n with < and <tool_ but no call.  \n"
    assert parse("hermes", plain) == (plain, [])


def test_hermes_block_without_a_name_is_content_and_broken_arguments_are_reported():
    text = "x <tool_call>not json</tool_call> y"
    assert parse("hermes", text) == (text, [])
    content, calls = parse("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>')
    assert content == "" and calls[0].name == "add"
    assert calls[0].error is not None and "JSON" in calls[0].error and calls[0].arguments == {}


def test_hermes_unterminated_block_and_arguments_as_a_string():
    # a stop string may cut the end marker
    _, calls = parse("hermes", '<tool_call>{"name": "add", "arguments": {"a": 3}}')
    assert calls[0].arguments == {"a": 3}
    _, calls = parse("hermes", '<tool_call>{"name": "add", "arguments": "{\\"a\\": 4}"}</tool_call>')
    assert calls[0].arguments_json == '{"a": 4}' and calls[0].arguments == {"a": 4}


def test_llama3_json():
    _, calls = parse(
        "llama3_json",
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "note", "parameters": {}}',
    )
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1}), ("note", {})]
    assert parse("llama3_json", "The answer is {x}.") == ("The answer is {x}.", [])
    assert parse("llama3_json", '{"no": "name"}') == ('{"no": "name"}', [])
    content, calls = parse("llama3_json", '  {"name": "add", "parameters": {"a": 2}} and more')
    assert calls[0].arguments == {"a": 2} and content == "and more"


def test_qwen_reads_hermes_blocks_and_bare_calls_to_the_requests_tools():
    """Qwen2.5's small models often write the call object without its tags; only a reply that opens with an
    object naming one of the request's tools is read that way."""
    tagged = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    assert summary(parse("qwen", tagged, TOOLS)) == summary(parse("hermes", tagged, TOOLS))
    content, calls = parse("qwen", ' {"name": "add", "arguments": {"a": 1, "b": 2}}\n{"name": "note"}', TOOLS)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("note", {}),
    ]
    for text in ['{"name": "Ada", "years": 3}', '{"a": {"name": "add"}}', "{not json", "{"]:
        assert parse("qwen", text, TOOLS) == (text, []), text  # a JSON answer, not a call
    assert parse("qwen", '{"name": "add", "arguments": {}}', []) == ('{"name": "add", "arguments": {}}', [])
    assert (
        parse("hermes", '{"name": "add", "arguments": {}}', TOOLS)[1] == []
    )  # the Hermes parser is unchanged


def test_qwen3_coder_xml_converts_by_schema():
    text = (
        "ok<tool_call>\n<function=add>\n<parameter=a>\n5\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n"
        "</function>\n</tool_call><tool_call>\n<function=note>\n<parameter=text>\n12\n</parameter>\n</function>\n</tool_call>"
    )
    content, calls = parse("qwen3_coder", text, TOOLS)
    assert content == "ok"
    assert calls[0].arguments == {"a": 5, "b": 2.5}
    assert calls[1].arguments == {"text": "12"}  # a string parameter stays a string
    p = get_parser("qwen3_coder", TOOLS)
    assert p.parse(p.format_call("add", {"a": 7}))[1][0].arguments == {"a": 7}


@pytest.mark.parametrize("name", ["hermes", "qwen", "llama3_json", "qwen3_coder"])
def test_format_call_round_trips(name):
    p = get_parser(name, TOOLS, counter_ids())
    args = {"a": 1, "b": 2}
    content, calls = p.parse(p.format_call("add", args))
    assert content == "" and calls[0].name == "add" and calls[0].arguments == args


def test_streamed_deltas_are_openai_shaped():
    text = 'Hi <tool_call>{"name": "add", "arguments": {"a": 10, "b": 20}}</tool_call>'
    deltas = stream_in_pieces("hermes", text, list(range(len(text))))
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    head = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "add", "arguments": ""}}
    assert calls[0].to_openai() == head
    assert all(d.id is None and d.name is None for d in calls[1:])
    assert len(calls) > 5  # the arguments arrive in pieces, not at the end
    assert "".join(d.text for d in deltas if isinstance(d, ContentDelta)) == "Hi"
    assert "".join(d.arguments for d in calls) == '{"a": 10, "b": 20}'


SAMPLES = {
    "hermes": [
        'Sure.\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}"}]}}\n</tool_call>\n'
        '<tool_call>{"name": "note", "arguments": {"text": "x"}}</tool_call> done',
        "<tool_call>broken</tool_call> then <tool_c text <tool_call>",
        '<tool_call>{"arguments": {"z": "\\u00e9\\n"}, "name": "note"}',
        '<tool_call>{"name": "f", "arguments": "{\\"q\\": 1}"}</tool_call>\n',
        "no calls at all   \n",
    ],
    "llama3_json": [
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "note", "parameters": {"text": "; }"}}',
        '{"name": "add", "parameters": {"a": 1}} tail',
        "<|python",
        "plain {text}",
    ],
    "qwen": [
        '{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}"}]}}\n{"name": "note", "arguments": {}} tail',
        '  {"name": "Ada", "arguments": {"a": 1}}',
        '{"name"',
        'ok <tool_call>{"name": "add", "arguments": {"a": 3}}</tool_call>',
    ],
    "qwen3_coder": [
        "pre <tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call> post",
        "<tool_call>\n<function=note>\n<parameter=text>\nunterminated",
    ],
}


@pytest.mark.parametrize("name,text", [(n, t) for n, ts in SAMPLES.items() for t in ts])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_chunking_reassembles_to_the_whole_parse(name, text, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    whole = summary(parse(name, text, TOOLS))
    assert summary(assemble(stream_in_pieces(name, text, cuts, TOOLS))) == whole
    # character by character too
    assert summary(assemble(stream_in_pieces(name, text, list(range(len(text))), TOOLS))) == whole


def test_parser_choice_from_templates():
    qwen = '{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{"name": ...}</tool_call> Qwen'
    llama = (
        '{%- if tools %}Respond in the format {"name": function name, "parameters": dictionary}<|python_tag|>'
    )
    coder = "<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>"
    smol = "{% for message in messages %}<|im_start|>{{ message['role'] }}{% endfor %}"
    assert parser_for_template(qwen) == "qwen"
    assert parser_for_template(llama) == "llama3_json"
    assert parser_for_template(coder) == "qwen3_coder"
    assert parser_for_template(smol) == "hermes"
    assert parser_for_template(None) == "hermes"
    assert parser_for_template(smol, override="llama3_json") == "llama3_json"
    with pytest.raises(ConfigError, match="unknown tool-call parser 'nope'"):
        parser_for_template(smol, override="nope")


def test_tools_prompt_and_render_calls():
    p = get_parser("hermes")
    prompt = p.tools_prompt(TOOLS)
    assert '"name": "add"' in prompt and "<tool_call>" in prompt
    calls = [{"id": "x", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1})}}]
    assert parse_tool_calls(p.render_calls(calls))[1][0].arguments == {"a": 1}
