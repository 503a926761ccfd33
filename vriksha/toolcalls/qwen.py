"""Qwen2.5 / Qwen3 calls: Hermes blocks (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), which their
chat templates ask for, and the same call objects written bare as the whole reply, which Qwen2.5's small models
often write instead (Qwen2.5-Coder-0.5B-Instruct answers a weather question with
`{"name": "get_weather", "arguments": {"city": "Paris"}}` and no tags).

A reply is read as bare calls only where it opens with a JSON object whose "name" is one of the request's tools;
anything else (prose, a JSON answer such as a structured output, a call to an unknown function) is read as
Hermes text, so a reply with tags, or without calls, parses as the Hermes parser parses it.
"""

from __future__ import annotations

import json

from vriksha.toolcalls.base import ToolCallStream
from vriksha.toolcalls.hermes import HermesParser
from vriksha.toolcalls.jsonscan import scan_object
from vriksha.toolcalls.llama3 import Llama3JsonStream
from vriksha.toolcalls.types import Delta


class QwenStream(ToolCallStream):
    """Undecided until the reply's opening shows which way it is written; then the chosen stream reads it all."""

    def __init__(self, parser: QwenParser) -> None:
        super().__init__()
        self.parser = parser
        self.chosen: ToolCallStream | None = None

    def _choose(self, final: bool) -> ToolCallStream | None:
        """The stream for this reply, or None while its opening does not tell yet."""
        text = self.buf.lstrip()
        if not text:
            return self.parser.hermes_stream() if final else None
        if text[0] != "{":
            return self.parser.hermes_stream()
        scan = scan_object(self.buf, len(self.buf) - len(text))
        raw = scan.value(self.buf, "name")
        if raw is None:
            undecided = scan.end is None and scan.error is None and not final
            return None if undecided else self.parser.hermes_stream()
        try:
            name = json.loads(raw)
        except json.JSONDecodeError:
            name = None
        return (
            Llama3JsonStream(self.parser) if name in self.parser.tool_names() else self.parser.hermes_stream()
        )

    def feed(self, text: str) -> list[Delta]:
        self.buf += text
        if self.chosen is not None:
            return self.chosen.feed(text)
        self.chosen = self._choose(final=False)
        return self.chosen.feed(self.buf) if self.chosen is not None else []

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self.chosen is None:
            self.chosen = self._choose(final=True)
            assert self.chosen is not None
            out = self.chosen.feed(self.buf)
        return out + self.chosen.finish()

    def _advance(self, final: bool) -> list[Delta]:  # feed() and finish() hand the text to the chosen stream
        raise NotImplementedError


class QwenParser(HermesParser):
    name = "qwen"
    description = (
        "<tool_call>{json}</tool_call> blocks, or a reply that is only such call objects (Qwen2.5, Qwen3)"
    )

    def stream(self) -> ToolCallStream:
        return QwenStream(self)

    def hermes_stream(self) -> ToolCallStream:
        return super().stream()

    def tool_names(self) -> set[str]:
        return {str((tool.get("function") or tool).get("name")) for tool in self.tools}
