"""Llama 3.1/3.2 JSON calls: the reply is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`, several separated by `;`), or it is plain content.
"""

from __future__ import annotations

import json
from typing import Any

from vriksha.toolcalls.base import ToolCallStream, ToolParser, arguments_text
from vriksha.toolcalls.json_call import JsonCallBody
from vriksha.toolcalls.types import ContentDelta, Delta

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonStream(ToolCallStream):
    def __init__(self, parser: Llama3JsonParser) -> None:
        super().__init__()
        self.parser = parser
        self.pos = 0
        self.mode = "start"  # start | calls | content
        self.body: JsonCallBody | None = None

    def _advance(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while True:
            seg = self.buf[self.pos :]
            if self.mode == "content":
                if seg:
                    out.append(ContentDelta(seg))
                self.pos = len(self.buf)
                return out
            if self.mode == "start":
                s = seg.lstrip()
                if not s or (PYTHON_TAG.startswith(s) and not final):
                    if final and seg:
                        out.append(ContentDelta(seg))
                        self.pos = len(self.buf)
                    return out
                lead = len(seg) - len(s)
                if s.startswith(PYTHON_TAG):
                    self.pos += lead + len(PYTHON_TAG)
                    self.mode = "calls"
                elif s[0] == "{":
                    self.pos += lead
                    self.mode = "calls"
                else:
                    self.mode = "content"
                continue
            # calls: objects separated by whitespace and `;`
            if self.body is None:
                s = seg.lstrip(" \t\r\n;")
                if not s:
                    if final and self.num_calls == 0 and seg:
                        out.append(ContentDelta(seg))
                        self.pos = len(self.buf)
                    return out
                self.pos += len(seg) - len(s)
                if s[0] != "{":
                    self.mode = "content"
                    continue
                self.body = JsonCallBody(self.num_calls, self.parser.new_id(), offset=self.pos)
            body = self.body
            out.extend(body.update(self.buf, final))
            scan = body.scan
            if scan.end is None and scan.error is None and not final:
                return out
            stop = next((i for i in (scan.end, scan.error) if i is not None), len(self.buf))
            out.extend(body.update(self.buf[:stop], True))
            if body.name is None:
                self.mode = "content"
                self.body = None
                continue
            self.num_calls += 1
            self.pos = stop
            self.body = None
            if scan.error is not None:
                self.mode = "content"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    description = 'a reply that is {"name": ..., "parameters": {...}} (Llama 3.1/3.2), `;` between calls'

    def stream(self) -> ToolCallStream:
        return Llama3JsonStream(self)

    def format_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        return f'{{"name": {json.dumps(name)}, "parameters": {arguments_text(arguments)}}}'

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return "; ".join(
            self.format_call(str(c["function"]["name"]), c["function"]["arguments"]) for c in calls
        )

    def call_delimiters(self, name: str) -> tuple[str, str]:
        return f'{{"name": {json.dumps(name)}, "parameters": ', "}"

    def instructions(self) -> str:
        return (
            "To call a function, respond with only a JSON object of the form "
            '{"name": function name, "parameters": dictionary of argument name and its value}; '
            "separate several calls with `;`. Do not use variables."
        )
