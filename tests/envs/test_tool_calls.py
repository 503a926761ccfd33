"""The one tool-call reader the driver and the environments share."""

from vriksha.envs.core import ToolSpec
from vriksha.envs.tool_calls import ParsedToolCall, describe_tools, find_tool_call


def test_find_tool_call():
    assert find_tool_call(
        'x <tool_call>{"name": "calc", "arguments": {"e": "1+1"}}</tool_call>'
    ) == ParsedToolCall("calc", {"e": "1+1"})
    assert find_tool_call("no call") is None
    assert find_tool_call("<tool_call>{not json}</tool_call>") is None
    # generation stopped at the closing tag; arguments written as a JSON string
    assert find_tool_call('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}') == ParsedToolCall(
        "f", {"a": 2}
    )
    assert find_tool_call('<tool_call>{"arguments": {}}</tool_call>') is None  # no name: no call


def test_describe_tools_names_each_tool_and_the_format():
    text = describe_tools(
        [ToolSpec(name="calculator", description="Evaluate.", parameters={"type": "object"})]
    )
    assert "- calculator: Evaluate." in text and "<tool_call>" in text
