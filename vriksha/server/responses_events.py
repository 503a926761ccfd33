"""The streamed /v1/responses: a reply's pieces (reasoning text, answer text, tool-call deltas) as OpenAI's
Responses events, in order, each item opened, filled and closed:

    response.created, response.in_progress,
    response.output_item.added (reasoning), response.reasoning_text.delta..., response.reasoning_text.done,
        response.output_item.done,
    response.output_item.added (message), response.content_part.added, response.output_text.delta...,
        response.output_text.done, response.content_part.done, response.output_item.done,
    response.output_item.added (function_call), response.function_call_arguments.delta...,
        response.function_call_arguments.done, response.output_item.done,
    response.completed (or response.incomplete)
"""

from __future__ import annotations

from typing import Any

from vriksha.server.responses_items import (
    function_call_item,
    item_id,
    message_item,
    output_text_part,
    reasoning_item,
)
from vriksha.toolcalls import ContentDelta, ToolCallDelta

Event = dict[str, Any]


class _Open:
    """The item being streamed: its kind, id, text so far, and (a call) its call id and name."""

    def __init__(self, kind: str, index: int, call: ToolCallDelta | None = None) -> None:
        self.kind = kind
        self.index = index  # its output_index
        self.id = item_id({"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind])
        self.text: list[str] = []
        self.call_index = call.index if call is not None else None
        self.call_id = call.id if call is not None else None
        self.name = call.name if call is not None else None


class ResponseEvents:
    """Events of one streamed response; `items` holds the finished output items (for the final body)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: _Open | None = None
        self._seq = 0

    def event(self, kind: str, **fields: Any) -> Event:
        out = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return out

    def lifecycle(self, kind: str, response: dict[str, Any]) -> Event:
        """response.created / in_progress / completed / incomplete / failed, carrying the response."""
        return self.event(kind, response=response)

    # -- pieces ---------------------------------------------------------------------------------------

    def reasoning(self, text: str) -> list[Event]:
        return self._delta("reasoning", "response.reasoning_text.delta", text)

    def text(self, text: str) -> list[Event]:
        return self._delta("message", "response.output_text.delta", text, logprobs=[])

    def _delta(self, kind: str, event_type: str, text: str, **extra: Any) -> list[Event]:
        """`text` added to the open item of `kind` (opened, and the previous one closed, as needed)."""
        if not text:
            return []
        out = self._switch(kind)
        item = self._current
        item.text.append(text)
        out.append(
            self.event(
                event_type, item_id=item.id, output_index=item.index, content_index=0, delta=text, **extra
            )
        )
        return out

    def call(self, delta: ToolCallDelta) -> list[Event]:
        out: list[Event] = []
        cur = self._open
        if cur is None or cur.kind != "function_call" or cur.call_index != delta.index:
            out += self.close()
            cur = self._open = _Open("function_call", len(self.items), delta)
            added = function_call_item(cur.call_id or "", cur.name or "", "", cur.id, "in_progress")
            out.append(self.event("response.output_item.added", output_index=cur.index, item=added))
        if delta.arguments:
            cur.text.append(delta.arguments)
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=cur.id,
                    output_index=cur.index,
                    delta=delta.arguments,
                )
            )
        return out

    def pieces(self, reasoning: str, parsed: list[ContentDelta | ToolCallDelta]) -> list[Event]:
        """A step's reasoning text and its answer (through the tool-call parser, or as one ContentDelta)."""
        out = self.reasoning(reasoning)
        for p in parsed:
            out += self.text(p.text) if isinstance(p, ContentDelta) else self.call(p)
        return out

    # -- items ----------------------------------------------------------------------------------------

    @property
    def _current(self) -> _Open:
        assert self._open is not None
        return self._open

    def _switch(self, kind: str) -> list[Event]:
        if self._open is not None and self._open.kind == kind:
            return []
        out = self.close()
        cur = self._open = _Open(kind, len(self.items))
        if kind == "reasoning":
            added = reasoning_item("", cur.id, "in_progress")
            added["content"] = []
            out.append(self.event("response.output_item.added", output_index=cur.index, item=added))
        else:
            added = message_item(None, cur.id, "in_progress")
            out.append(self.event("response.output_item.added", output_index=cur.index, item=added))
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=cur.id,
                    output_index=cur.index,
                    content_index=0,
                    part=output_text_part(""),
                )
            )
        return out

    def close(self) -> list[Event]:
        """Close the open item (at a switch of kind, and at the end)."""
        cur, self._open = self._open, None
        if cur is None:
            return []
        text = "".join(cur.text)
        out: list[Event] = []
        where = {"item_id": cur.id, "output_index": cur.index}
        if cur.kind == "reasoning":
            item = reasoning_item(text, cur.id)
            out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=text))
        elif cur.kind == "message":
            item = message_item(text, cur.id)
            out.append(
                self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            )
            out.append(
                self.event("response.content_part.done", **where, content_index=0, part=item["content"][0])
            )
        else:
            item = function_call_item(cur.call_id or "", cur.name or "", text, cur.id)
            out.append(
                self.event("response.function_call_arguments.done", **where, name=cur.name, arguments=text)
            )
        self.items.append(item)
        out.append(self.event("response.output_item.done", output_index=cur.index, item=item))
        return out
