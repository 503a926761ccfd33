"""The driver's and the environments' one way to find a tool call (over `vriksha.toolcalls`)."""

from vriksha.envs.core import ToolSpec
from vriksha.envs.tool_calls import describe_tools, find_tool_call


def _call(text, **kw):
    call = find_tool_call(text, **kw)
    return None if call is None else (call.name, call.arguments)


def test_find_tool_call():
    assert _call('x <tool_call>{"name": "calc", "arguments": {"e": "1+1"}}</tool_call>') == (
        "calc",
        {"e": "1+1"},
    )
    assert _call("no call") is None
    assert _call("<tool_call>{not json}</tool_call>") is None
    # generation stopped before the closing tag; arguments written as a JSON string
    assert _call('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}') == ("f", {"a": 2})
    assert _call('<tool_call>{"arguments": {}}</tool_call>') is None  # no name: no call
    assert _call('<tool_call>{"name": "f", "arguments": [1]}</tool_call>') == ("f", {})


def test_other_conventions_by_name():
    assert _call('{"name": "calc", "parameters": {"e": "2"}}', parser="llama3_json") == ("calc", {"e": "2"})


def test_describe_tools_names_each_tool_and_the_format():
    text = describe_tools(
        [ToolSpec(name="calculator", description="Evaluate.", parameters={"type": "object"})]
    )
    assert "- calculator: Evaluate." in text and "<tool_call>" in text
