"""The parser interface, and the stream of text with tool-call blocks between markers that most formats share.

A parser is used two ways that always agree: `stream()` gives an incremental parser fed the generated text
piece by piece, producing OpenAI-style deltas; `parse(text)` is that same machine fed the whole text at once
and its deltas reassembled. Every decision depends only on the text seen so far, so how the text is cut
into pieces never changes the result.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from vriksha.toolcalls.types import ContentDelta, Delta, ToolCall, ToolCallDelta, assemble, new_call_id

IdFactory = Callable[[], str]


class CallBody(ABC):
    """Reads one call's text as it grows; emits its head once the name is known, then argument text."""

    def __init__(self, index: int, call_id: str) -> None:
        self.index = index
        self.id = call_id
        self.name: str | None = None
        self._sent = 0
        self._head_sent = False

    @abstractmethod
    def _read(self, text: str, final: bool) -> str:
        """Update `self.name` from `text`; return the argument text so far (a prefix of the final one)."""

    def update(self, text: str, final: bool) -> list[Delta]:
        args = self._read(text, final)
        if self.name is None:
            return []
        piece = args[self._sent :]
        self._sent = len(args)
        if not self._head_sent:
            self._head_sent = True
            return [ToolCallDelta(self.index, piece, self.id, self.name)]
        return [ToolCallDelta(self.index, piece)] if piece else []


class ToolCallStream(ABC):
    """Incremental parser: `feed(text)` -> deltas, `finish()` -> the last deltas."""

    def __init__(self) -> None:
        self.buf = ""
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        self.buf += text
        return self._advance(final=False)

    def finish(self) -> list[Delta]:
        return self._advance(final=True)

    @abstractmethod
    def _advance(self, final: bool) -> list[Delta]: ...


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (kept back until known)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ContentSink:
    """Content text around calls, kept exactly except for whitespace next to a call: before the first
    content, after the last and the extra around a call between two texts (one run of it stays)."""

    def __init__(self) -> None:
        self.pending_ws = ""
        self.strip_leading = False
        self.emitted = False

    def text(self, t: str, out: list[Delta]) -> None:
        if self.strip_leading:
            t = t.lstrip()
            if not t:
                return
            self.strip_leading = False
        s = self.pending_ws + t
        body = s.rstrip()
        self.pending_ws = s[len(body) :]
        if body:
            out.append(ContentDelta(body))
            self.emitted = True

    def literal(self, t: str, out: list[Delta]) -> None:
        """Text that must pass unchanged (a block that turned out not to be a call)."""
        if t:
            out.append(ContentDelta(t))
            self.emitted = True
        self.pending_ws = ""
        self.strip_leading = False

    def take_ws(self) -> str:
        ws, self.pending_ws = self.pending_ws, ""
        return ws

    def after_call(self, ws_before: str) -> None:
        """A call was read: keep one whitespace run between texts, drop the whitespace after the call."""
        self.pending_ws = ws_before if self.emitted else ""
        self.strip_leading = True

    def end(self, any_calls: bool, out: list[Delta]) -> None:
        if self.pending_ws and not any_calls:
            out.append(ContentDelta(self.pending_ws))
        self.pending_ws = ""


class BlockStream(ToolCallStream):
    """Calls written between a start and an end marker (`<tool_call>` ... `</tool_call>`), content around them.

    A block whose text never names a function is given back as content, unchanged. A block still open when
    the text ends is read as far as it goes (a stop string may have cut its end marker).
    """

    def __init__(self, start: str, end: str, new_body: Callable[[int], CallBody]) -> None:
        super().__init__()
        self.start, self.end = start, end
        self._new_body = new_body
        self.pos = 0
        self.body_start: int | None = None
        self.body: CallBody | None = None
        self.sink = ContentSink()
        self._ws_before = ""

    def _advance(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while True:
            if self.body_start is None:
                seg = self.buf[self.pos :]
                k = seg.find(self.start)
                if k < 0:
                    hold = 0 if final else partial_suffix(seg, self.start)
                    self.sink.text(seg[: len(seg) - hold], out)
                    self.pos += len(seg) - hold
                    if final:
                        self.sink.end(self.num_calls > 0, out)
                    return out
                self.sink.text(seg[:k], out)
                self._ws_before = self.sink.take_ws()
                self.pos += k + len(self.start)
                self.body_start = self.pos
                self.body = self._new_body(self.num_calls)
                continue
            assert self.body is not None
            seg = self.buf[self.body_start :]
            k = seg.find(self.end)
            closed = k >= 0
            if closed:
                text = seg[:k]
            else:
                text = seg[: len(seg) - (0 if final else partial_suffix(seg, self.end))]
            done = closed or final
            out.extend(self.body.update(text, done))
            if not done:
                return out
            if self.body.name is not None:
                self.num_calls += 1
                self.sink.after_call(self._ws_before)
            else:
                self.sink.literal(self._ws_before + self.start + text + (self.end if closed else ""), out)
            self.pos = self.body_start + (k + len(self.end) if closed else len(seg))
            self.body_start, self.body = None, None


class ToolParser(ABC):
    """One tool-call convention: how a model writes calls, read back into `ToolCall`s."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(
        self, tools: list[dict[str, Any]] | None = None, id_factory: IdFactory = new_call_id
    ) -> None:
        self.tools = tools or []
        self.new_id = id_factory

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A fresh incremental parser for one generated reply."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a whole reply; equal to what `stream()` yields for it, reassembled."""
        s = self.stream()
        return assemble(s.feed(text) + s.finish())

    @abstractmethod
    def format_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        """The text a model of this convention writes for one call."""

    def call_delimiters(self, name: str) -> tuple[str, str] | None:
        """(text before, text after) the arguments' JSON in one call, for a grammar; None if not JSON."""
        return None

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """OpenAI `tool_calls` of an assistant message, as the text the model would have written."""
        parts = []
        for c in calls:
            fn = c.get("function", c)
            parts.append(self.format_call(str(fn.get("name", "")), fn.get("arguments", {})))
        return "\n".join(parts)

    @abstractmethod
    def instructions(self) -> str:
        """How to call a tool in this convention, for a system message when the template does not say."""

    def tools_prompt(self, tools: list[dict[str, Any]]) -> str:
        """A system-message section listing `tools` (OpenAI format) and how to call them."""
        listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        return (
            "You may call one or more functions to assist with the user query. The functions available are:\n"
            f"<tools>\n{listed}\n</tools>\n\n{self.instructions()}"
        )


def arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
