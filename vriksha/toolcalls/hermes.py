"""Hermes-style calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5, Qwen3).

The default for chat templates that do not define a convention (the embedded SmolLM2 among them).
"""

from __future__ import annotations

import json
from typing import Any

from vriksha.toolcalls.base import BlockStream, ToolCallStream, ToolParser, arguments_text
from vriksha.toolcalls.json_call import JsonCallBody

START, END = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name = "hermes"
    description = "<tool_call>{json}</tool_call> blocks (Hermes, Qwen2.5/Qwen3, ChatML models)"

    def stream(self) -> ToolCallStream:
        return BlockStream(START, END, lambda i: JsonCallBody(i, self.new_id()))

    def format_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        return f'{START}\n{{"name": {json.dumps(name)}, "arguments": {arguments_text(arguments)}}}\n{END}'

    def call_delimiters(self, name: str) -> tuple[str, str]:
        return f'{START}\n{{"name": {json.dumps(name)}, "arguments": ', f"}}\n{END}"

    def instructions(self) -> str:
        return (
            "To call a function, reply with one JSON object per call, each inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )
