"""Tool calls in a model's text, for the episode driver and the environments: one call over the project's
one parser package (`vriksha.toolcalls`, which the server uses too).

`find_tool_call(text)` is the first call a reply holds (Hermes-style `<tool_call>{"name": ...,
"arguments": {...}}</tool_call>` by default; any `vriksha.toolcalls` convention by name).
`TOOL_CALL_FORMAT` is the instruction that tells a model to write Hermes calls, for prompts whose
chat template does not describe tools itself.
"""

from __future__ import annotations

import json
from typing import Any

from vriksha.toolcalls import DEFAULT_PARSER, ToolCall, parse_tool_calls

__all__ = ["MARKER", "TOOL_CALL_FORMAT", "ToolCall", "describe_tools", "find_tool_call"]

TOOL_CALL_FORMAT = (
    'To call a tool, reply with only <tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>; '
    "the result comes back in the next message. Tools:\n{tools}"
)
MARKER = "<tool_call>"  # where a Hermes call starts


def find_tool_call(text: str, parser: str = DEFAULT_PARSER) -> ToolCall | None:
    """The first call in `text` (its arguments `{}` when they are not a JSON object), or None: no call,
    or one whose JSON does not parse."""
    _, calls = parse_tool_calls(text, parser)
    return next((c for c in calls if c.name), None)


def describe_tools(tools: list[Any]) -> str:
    """`TOOL_CALL_FORMAT` filled in with `tools` (`ToolSpec`s: name, description, parameters)."""
    lines = "\n".join(f"- {t.name}: {t.description} parameters: {json.dumps(t.parameters)}" for t in tools)
    return TOOL_CALL_FORMAT.format(tools=lines)
