"""Qwen3-Coder's XML calls: `<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>`.

Parameter values are text; they become JSON by the type the tool's parameter schema gives them (strings stay
strings without a schema). The arguments stream as JSON, one whole parameter at a time.
"""

from __future__ import annotations

import json
import re
from typing import Any

from vriksha.toolcalls.base import BlockStream, CallBody, ToolCallStream, ToolParser
from vriksha.toolcalls.hermes import END, START

_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_OPEN_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*)$", re.DOTALL)


def _convert(value: str, schema: dict[str, Any] | None) -> Any:
    kind = (schema or {}).get("type", "string")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


class XmlCallBody(CallBody):
    def __init__(self, index: int, call_id: str, tools: dict[str, dict[str, Any]]) -> None:
        super().__init__(index, call_id)
        self.tools = tools

    def _read(self, text: str, final: bool) -> str:
        fn = _FUNCTION.search(text)
        if fn is None:
            return ""
        self.name = fn.group(1).strip()
        props = self.tools.get(self.name, {}).get("properties", {})
        rest = text[fn.end() :].split("</function>", 1)[0]
        params = [(m.group(1).strip(), m.group(2)) for m in _PARAM.finditer(rest)]
        if final:
            last = rest.rfind("</parameter>")
            tail = rest[last + len("</parameter>") :] if last >= 0 else rest
            if m := _OPEN_PARAM.search(tail):
                params.append((m.group(1).strip(), m.group(2)))
        pieces = []
        for i, (key, raw) in enumerate(params):
            value = _convert(raw.removeprefix("\n").removesuffix("\n"), props.get(key))
            pieces.append(
                ("{" if i == 0 else ", ") + f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"
            )
        text_so_far = "".join(pieces)
        if final:
            text_so_far = text_so_far + "}" if pieces else "{}"
        return text_so_far


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    description = (
        "<tool_call><function=NAME><parameter=KEY>...</parameter></function></tool_call> (Qwen3-Coder)"
    )

    def _schemas(self) -> dict[str, dict[str, Any]]:
        out = {}
        for t in self.tools:
            fn = t.get("function", t)
            out[str(fn.get("name"))] = fn.get("parameters") or {}
        return out

    def stream(self) -> ToolCallStream:
        schemas = self._schemas()
        return BlockStream(START, END, lambda i: XmlCallBody(i, self.new_id(), schemas))

    def format_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
            for k, v in args.items()
        )
        return f"{START}\n<function={name}>\n{params}</function>\n{END}"

    def instructions(self) -> str:
        return (
            "To call a function, reply with:\n<tool_call>\n<function=example_function_name>\n"
            "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>"
        )
