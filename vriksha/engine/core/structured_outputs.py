"""What a request's output must match: a JSON schema, any JSON object, a regex, one of some strings, a grammar.

Field names follow vLLM's `StructuredOutputsParams`; exactly one is set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vriksha.errors import InvalidRequestError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(slots=True, frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (dict or its text)
    json_object: bool | None = None  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None  # Lark (llguidance dialect) or GBNF

    def __post_init__(self) -> None:
        set_ = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_) != 1:
            raise InvalidRequestError(
                f"structured_outputs needs exactly one of {', '.join(KINDS)}; got "
                f"{', '.join(set_) if set_ else 'none'}"
            )
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) for c in self.choice):
                raise InvalidRequestError("structured_outputs.choice must be a non-empty list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"structured_outputs.json is not valid JSON: {e}") from None

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> str:
        """A stable text key (grammars are compiled once per key)."""
        value = getattr(self, self.kind)
        return self.kind + ":" + (json.dumps(value, sort_keys=True) if not isinstance(value, str) else value)
