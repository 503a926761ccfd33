"""One call written as a JSON object with a name and arguments (Hermes, Qwen, Llama 3 JSON)."""

from __future__ import annotations

import json

from vriksha.toolcalls.base import CallBody
from vriksha.toolcalls.jsonscan import ObjectScan, scan_object

ARGUMENT_KEYS = ("arguments", "parameters")


class JsonCallBody(CallBody):
    """`{"name": "f", "arguments": {...}}`: the argument object's raw text streams as the model writes it.

    Arguments given as a JSON string (`"arguments": "{\\"x\\": 1}"`) are passed on decoded, once whole; no
    arguments at all read as `{}`.
    """

    def __init__(self, index: int, call_id: str, offset: int = 0) -> None:
        super().__init__(index, call_id)
        self.offset = offset  # where the object starts in the text given to update()
        self.scan = ObjectScan()

    def _read(self, text: str, final: bool) -> str:
        self.scan = scan = scan_object(text, self.offset)
        if self.name is None:
            raw = scan.value(text, "name")
            if raw is not None:
                try:
                    value = json.loads(raw)
                except json.JSONDecodeError:
                    value = None
                if isinstance(value, str) and value:
                    self.name = value
        spans = [scan.keys[k] for k in ARGUMENT_KEYS if k in scan.keys]
        if not spans:
            return "{}" if final else ""
        start, end = min(spans)
        if text[start] == '"':
            if end is None:
                return ""
            try:
                decoded = json.loads(text[start:end])
            except json.JSONDecodeError:
                return text[start:end]
            return decoded if isinstance(decoded, str) else text[start:end]
        return text[start : end if end is not None else len(text)]
