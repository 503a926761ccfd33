"""The semantic cache: an earlier answer served again when a new request is similar enough. Entries are
scoped by (API key, end user, pool, context): the end user is the OpenAI `user` field; the context is the
whole request except the last user message's text (earlier turns, system prompt, sampling fields), so only
the wording of that one message may differ. TTL,
a global size bound (least recently used first out), and two cheap guards against near misses that embed
alike: the same numbers in both texts (number words counted: "three" is 3), and the words both texts share
in the same order ("10 miles to km" is not "10 km to miles")."""

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
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_IGNORED = ("stream", "stream_options", "user", "model")
_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
)
_ORDINALS = "zeroth first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth"
NUMBER_WORDS = {w: str(i) for i, w in enumerate(_UNITS.split())}
NUMBER_WORDS |= {w: str(i) for i, w in enumerate(_ORDINALS.split())}
NUMBER_WORDS |= {
    "twenty": "20",
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "hundred": "100",
    "thousand": "1000",
}
NUMBER_WORDS |= {"dozen": "12", "half": "0.5", "once": "1", "twice": "2"}
del NUMBER_WORDS["one"]  # mostly a pronoun ("which one is faster")


def numbers(text: str) -> tuple[str, ...]:
    """The numbers in `text`, number words ("three", "second") as digits."""
    words = [NUMBER_WORDS.get(w, w) for w in _WORD.findall(text.lower())]
    return tuple(n for w in words for n in _NUMBER.findall(w))


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def same_order(a: list[str], b: list[str]) -> bool:
    """Whether the words `a` and `b` share come in the same order ("miles to km" is not "km to miles")."""
    common = set(a) & set(b)
    seq_a = [w for w in dict.fromkeys(w for w in a if w in common)]
    seq_b = [w for w in dict.fromkeys(w for w in b if w in common)]
    return seq_a == seq_b


@dataclass(slots=True)
class Entry:
    scope: str
    emb: torch.Tensor
    numbers: tuple[str, ...]
    words: list[str]
    body: bytes
    expires: float
    prefilter_emb: torch.Tensor | None = None  # the static vector, for `might_hit`


def scope_key(api_key: str | None, pool: str, endpoint: str, body: dict[str, Any], text: str) -> str:
    """One scope per API key, end user (the OpenAI `user` field: end users sharing a key never see each
    other's answers), pool, endpoint and context (the request minus the routed text)."""
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
    blob = json.dumps([key, body.get("user"), pool, endpoint, ctx], sort_keys=True, default=str)
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
        return numbers(text) if self.cfg.same_numbers else ()

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
        nums, ws = self._numbers(text), words(text)
        order = torch.argsort(sims, descending=True).tolist()
        for j in order:
            sim = float(sims[j])
            if sim < self.cfg.threshold:
                break
            e = self.entries[ids[j]]
            if e.numbers == nums and (not self.cfg.same_order or same_order(e.words, ws)):
                self.entries.move_to_end(ids[j])
                return e.body, sim
        return None

    def might_hit(self, scope: str, prefilter_emb: torch.Tensor, floor: float) -> bool:
        """Whether an unexpired entry of `scope` is within `floor` of `prefilter_emb` by the cheap vectors (an
        entry stored without one always might): False means `lookup` cannot hit, so its vector can wait."""
        now = time.monotonic()
        live = [self.entries[i] for i in self.scopes.get(scope, ()) if self.entries[i].expires > now]
        if any(e.prefilter_emb is None for e in live):
            return True
        if not live:
            return False
        return bool((torch.stack([e.prefilter_emb for e in live]) @ prefilter_emb).max() >= floor)

    def store(
        self, scope: str, emb: torch.Tensor, text: str, body: bytes, prefilter_emb: torch.Tensor | None = None
    ) -> None:
        eid = self._next
        self._next += 1
        expires = time.monotonic() + self.cfg.ttl_s
        self.entries[eid] = Entry(scope, emb, self._numbers(text), words(text), body, expires, prefilter_emb)
        self.scopes.setdefault(scope, []).append(eid)
        while len(self.entries) > self.cfg.max_entries:
            self._drop(next(iter(self.entries)))
