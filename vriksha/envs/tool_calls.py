"""Reading a tool call out of a model's text: one function, used by the episode driver and the environments.

Calls are written Hermes-style, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the closing
tag may be missing when generation stopped at it). `TOOL_CALL_FORMAT` is the instruction that tells a
model so, for prompts whose chat template does not describe tools itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ParsedToolCall", "TOOL_CALL_FORMAT", "find_tool_call", "describe_tools"]

TOOL_CALL_FORMAT = (
    'To call a tool, reply with only <tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>; '
    "the result comes back in the next message. Tools:\n{tools}"
)
MARKER = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """The first tool call a reply holds."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def find_tool_call(text: str) -> ParsedToolCall | None:
    """The first whole call in `text`, or None (no call, or one whose JSON does not parse)."""
    if MARKER not in text:
        return None
    m = _BLOCK.search(text)
    if not m:
        return None
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = {}
    return ParsedToolCall(obj["name"], args if isinstance(args, dict) else {})


def describe_tools(tools: list[Any]) -> str:
    """`TOOL_CALL_FORMAT` filled in with `tools` (`ToolSpec`s: name, description, parameters)."""
    lines = "\n".join(f"- {t.name}: {t.description} parameters: {json.dumps(t.parameters)}" for t in tools)
    return TOOL_CALL_FORMAT.format(tools=lines)
