"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: at most `max_stored` of them (the
least recently used dropped first), each for `ttl_s` seconds after it was last used.

A stored response keeps its conversation as chat messages (the input it continued, its input, its output),
so that a follow-up renders the whole conversation through the chat template again: its prefix is then
found in the engine's prefix cache. Each stored response also names its conversation (the id of the chain's
first response): the engine session the conversation's requests run under, which keeps its K/V pinned between
turns (`serving_responses.py`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class StoredResponse:
    body: dict[str, Any]  # the Response object as returned
    conversation: list[dict[str, Any]]  # chat messages up to and including this response's output
    used_at: float
    conversation_id: str = (
        ""  # the first response of the chain this one continues (itself when it starts one)
    )


class ResponseStore:
    def __init__(self, max_stored: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_stored = max_stored
        self.ttl_s = ttl_s
        self._clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def put(
        self, body: dict[str, Any], conversation: list[dict[str, Any]], conversation_id: str | None = None
    ) -> None:
        if self.max_stored <= 0:
            return
        cid = conversation_id or body["id"]
        self._items[body["id"]] = StoredResponse(body, conversation, self._clock(), cid)
        self._items.move_to_end(body["id"])
        while len(self._items) > self.max_stored:
            self._items.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        """The response, its time of last use renewed; None when unknown, dropped or expired."""
        self._expire()
        item = self._items.get(rid)
        if item is not None:
            item.used_at = self._clock()
            self._items.move_to_end(rid)
        return item

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl_s
        while self._items:
            rid, oldest = next(iter(self._items.items()))
            if oldest.used_at > cutoff:
                return
            del self._items[rid]
