"""What the tool-call parsers produce: whole calls, and the deltas a stream is made of."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    """An OpenAI-style call id (`call_` + 24 hex digits)."""
    return "call_" + secrets.token_hex(12)


@dataclass(slots=True)
class ToolCall:
    """One function call the model wrote.

    `arguments_json` is the arguments exactly as they reach the client (OpenAI's `function.arguments`);
    `arguments` is that text parsed, or `{}` with `error` saying why it is not a JSON object.
    """

    id: str
    name: str
    arguments_json: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def from_json(cls, id: str, name: str, arguments_json: str) -> ToolCall:
        try:
            value = json.loads(arguments_json)
        except json.JSONDecodeError as e:
            return cls(id, name, arguments_json, {}, f"arguments are not valid JSON: {e}")
        if not isinstance(value, dict):
            return cls(
                id, name, arguments_json, {}, f"arguments are a JSON {type(value).__name__}, not an object"
            )
        return cls(id, name, arguments_json, value, None)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_openai(self) -> dict[str, Any]:
        """The `message.tool_calls[i]` entry of a chat completion."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        }


@dataclass(slots=True)
class ContentDelta:
    """Plain text of the reply (outside any tool call)."""

    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of call `index`: its first delta carries `id` and `name`, later ones more argument text."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """One entry of a streamed chunk's `delta.tool_calls`."""
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        out["function"] = function
        return out


Delta = ContentDelta | ToolCallDelta


def assemble(deltas: list[Delta]) -> tuple[str, list[ToolCall]]:
    """Reassemble a stream of deltas into (content, calls), as a client reassembles OpenAI chunks."""
    content: list[str] = []
    parts: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str]] = {}
    for d in deltas:
        if isinstance(d, ContentDelta):
            content.append(d.text)
            continue
        if d.id is not None:
            heads[d.index] = (d.id, d.name or "")
        parts.setdefault(d.index, []).append(d.arguments)
    calls = [ToolCall.from_json(heads[i][0], heads[i][1], "".join(parts[i])) for i in sorted(heads)]
    return "".join(content), calls
