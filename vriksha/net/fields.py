"""Validated field types for request bodies, shared by every server's protocol models: finite floats, integers
that fit 64 (or 32) bits, and text that is valid Unicode wherever it sits in a body (the path is reported)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Int32 = Annotated[int, Field(ge=-(2**31), le=INT32_MAX)]
Seed = Annotated[int, Field(ge=0, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


def _bad_text(s: str) -> tuple[int, str] | None:
    """(character index, code point) of the first unpaired surrogate in `s`, or None when `s` is valid."""
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start, f"U+{ord(s[exc.start]):04X}"
    return None


def _key(k: Any) -> str:
    return k if isinstance(k, str) and _bad_text(k) is None else ascii(k)


def find_invalid_text(obj: Any, path: str = "") -> tuple[str, int, str] | None:
    """The first string in a JSON-like value that is not valid Unicode: (path, index, code point)."""
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            bad = _bad_text(value)
            if bad is not None:
                return where or "body", bad[0], bad[1]
        elif isinstance(value, dict):
            items = list(value.items())
            for k, v in reversed(items):
                sub = f"{where}.{_key(k)}" if where else _key(k)
                if isinstance(k, str) and _bad_text(k) is not None:
                    return f"{sub} (the key)", _bad_text(k)[0], _bad_text(k)[1]  # type: ignore[index]
                if isinstance(v, (str, dict, list)):
                    stack.append((v, sub))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                v = value[i]
                if isinstance(v, (str, dict, list)):
                    stack.append((v, f"{where}[{i}]"))
    return None


class ValidText:
    """Mixin for pydantic models at a process boundary: refuse a body holding text that is not valid Unicode
    (a lone UTF-16 surrogate, which JSON's `\\ud800` escapes can carry), naming where it is."""

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        found = find_invalid_text(data)
        if found is not None:
            where, index, code = found
            raise PydanticCustomError(
                "invalid_unicode",
                "{where}: the text is not valid Unicode (an unpaired surrogate {code} at character {index}); "
                "send UTF-8 text, with any \\uD800-\\uDFFF escapes in valid pairs",
                {"where": where, "code": code, "index": index},
            )
        return data


class WireModel(ValidText, BaseModel):
    """Strict request-body base: unknown fields refused, no type coercion, text valid Unicode."""

    model_config = ConfigDict(extra="forbid", strict=True)
