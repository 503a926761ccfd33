"""A scanner over a JSON object that may still be arriving: where its top-level keys' values start and end.

It never decodes the values (that is left to `json.loads` once they are whole); it only finds spans, so a
parser can stream the raw text of a value while it is being written. Every answer depends only on the text
seen so far: scanning a longer prefix never changes what a shorter one established.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_WS = " \t\n\r"
_SCALAR = set("-+.0123456789eEtrufalsn")


@dataclass(slots=True)
class ObjectScan:
    """The state of `text` read as one JSON object (leading whitespace allowed)."""

    started: bool = False  # a `{` was seen
    end: int | None = None  # index just past the closing `}` once the object is whole
    error: int | None = None  # index of the first character that cannot continue a JSON object
    keys: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # key -> (value start, end)

    def value(self, text: str, key: str) -> str | None:
        """The complete raw text of `key`'s value, or None while it is incomplete or absent."""
        span = self.keys.get(key)
        if span is None or span[1] is None:
            return None
        return text[span[0] : span[1]]


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def string_end(s: str, i: int) -> int | None:
    """`s[i]` is `"`: the index just past the closing quote, or None if the string is still open."""
    j = i + 1
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(s: str, i: int) -> int | None:
    """The end of the JSON value starting at `s[i]`, or None while it is incomplete.

    Raises ValueError at a character that cannot start a value. Containers are matched by bracket depth
    (strings skipped); their inside is not validated here.
    """
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in "{[":
        depth, j = 0, i
        while j < len(s):
            ch = s[j]
            if ch == '"':
                e = string_end(s, j)
                if e is None:
                    return None
                j = e
                continue
            if ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    if c in _SCALAR:
        j = i
        while j < len(s) and s[j] in _SCALAR:
            j += 1
        return j if j < len(s) else None  # a number may still grow
    raise ValueError(i)


def scan_object(s: str, start: int = 0) -> ObjectScan:
    out = ObjectScan()
    i = _skip_ws(s, start)
    if i >= len(s):
        return out
    if s[i] != "{":
        out.error = i
        return out
    out.started = True
    i += 1
    while True:
        i = _skip_ws(s, i)
        if i >= len(s):
            return out
        if s[i] == "}" and not out.keys:
            out.end = i + 1
            return out
        if s[i] != '"':
            out.error = i
            return out
        k_end = string_end(s, i)
        if k_end is None:
            return out
        try:
            key = json.loads(s[i:k_end])
        except json.JSONDecodeError:
            out.error = i
            return out
        i = _skip_ws(s, k_end)
        if i >= len(s):
            return out
        if s[i] != ":":
            out.error = i
            return out
        i = _skip_ws(s, i + 1)
        if i >= len(s):
            return out
        try:
            v_end = value_end(s, i)
        except ValueError:
            out.error = i
            return out
        out.keys.setdefault(key, (i, v_end))  # the first occurrence counts, as it is seen first
        if v_end is None:
            return out
        i = _skip_ws(s, v_end)
        if i >= len(s):
            return out
        if s[i] == ",":
            i += 1
            continue
        if s[i] == "}":
            out.end = i + 1
            return out
        out.error = i
        return out
