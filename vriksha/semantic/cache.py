"""The semantic cache: an earlier answer served again when a new request is similar enough. Entries are
scoped by (API key, pool, context): the context is the whole request except the last user message's text
(earlier turns, system prompt, sampling fields), so only the wording of that one message may differ. TTL,
a global size bound (least recently used first out), and optionally the same numbers in both texts."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from vriksha.semantic.config import CacheConfig

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_IGNORED = ("stream", "stream_options", "user", "model")


@dataclass(slots=True)
class Entry:
    scope: str
    emb: torch.Tensor
    numbers: tuple[str, ...]
    body: bytes
    expires: float


def scope_key(api_key: str | None, pool: str, endpoint: str, body: dict[str, Any], text: str) -> str:
    """One scope per API key, pool, endpoint and context (the request minus the routed text)."""
    ctx = {k: v for k, v in body.items() if k not in _IGNORED}
    if "messages" in ctx:
        msgs = list(ctx["messages"])
        for i in range(len(msgs) - 1, -1, -1):
            if isinstance(msgs[i], dict) and msgs[i].get("role") == "user":
                msgs[i] = {**msgs[i], "content": None}
                break
        ctx["messages"] = msgs
    elif isinstance(ctx.get("prompt"), str):
        ctx["prompt"] = None
    key = hashlib.sha256((api_key or "").encode()).hexdigest()
    blob = json.dumps([key, pool, endpoint, ctx], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class SemanticCache:
    def __init__(self, cfg: CacheConfig) -> None:
        self.cfg = cfg
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.scopes: dict[str, list[int]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self.entries)

    def _numbers(self, text: str) -> tuple[str, ...]:
        return tuple(_NUMBER.findall(text)) if self.cfg.same_numbers else ()

    def _drop(self, eid: int) -> None:
        e = self.entries.pop(eid, None)
        if e is not None:
            ids = self.scopes.get(e.scope)
            if ids is not None:
                ids.remove(eid)
                if not ids:
                    del self.scopes[e.scope]

    def lookup(self, scope: str, emb: torch.Tensor, text: str) -> tuple[bytes, float] | None:
        """The cached body and its similarity, or None."""
        ids = self.scopes.get(scope)
        if not ids:
            return None
        now = time.monotonic()
        for eid in [i for i in ids if self.entries[i].expires <= now]:
            self._drop(eid)
        ids = self.scopes.get(scope)
        if not ids:
            return None
        sims = torch.stack([self.entries[i].emb for i in ids]) @ emb
        numbers = self._numbers(text)
        order = torch.argsort(sims, descending=True).tolist()
        for j in order:
            sim = float(sims[j])
            if sim < self.cfg.threshold:
                break
            e = self.entries[ids[j]]
            if e.numbers == numbers:
                self.entries.move_to_end(ids[j])
                return e.body, sim
        return None

    def store(self, scope: str, emb: torch.Tensor, text: str, body: bytes) -> None:
        eid = self._next
        self._next += 1
        self.entries[eid] = Entry(scope, emb, self._numbers(text), body, time.monotonic() + self.cfg.ttl_s)
        self.scopes.setdefault(scope, []).append(eid)
        while len(self.entries) > self.cfg.max_entries:
            self._drop(next(iter(self.entries)))
