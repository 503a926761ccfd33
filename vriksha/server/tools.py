"""Tools in chat requests: validation, the prompt the model sees, the grammar that forces a call, and the
calls parsed back out of the reply (whole or streamed) with the one parser in `vriksha.toolcalls`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from vriksha.engine.grammar import JSON_OPTIONS
from vriksha.engine.structured_outputs import StructuredOutputsParams
from vriksha.server.errors import BadRequestError, ServerError, ToolCallMissingError
from vriksha.server.protocol import ChatCompletionRequest
from vriksha.server.sampling import check_structured
from vriksha.toolcalls import ToolParser, get_parser

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(slots=True)
class ToolPlan:
    """What a chat request's tools mean for this reply."""

    tools: list[dict[str, Any]]  # validated, OpenAI shape
    parser: ToolParser | None  # None: the reply is not parsed for calls (no tools, or tool_choice "none")
    parallel: bool
    forced: str | None  # "required", a function name, or None (the model chooses)

    @property
    def in_prompt(self) -> bool:
        return bool(self.tools) and self.parser is not None


def _check_schema(schema: Any, where: str) -> None:
    import jsonschema

    if not isinstance(schema, dict):
        raise BadRequestError(f"{where} must be a JSON Schema object", param=where)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise BadRequestError(f"{where} is not a valid JSON Schema: {e.message}", param=where) from None


def _validate_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise BadRequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}; only function tools exist here",
                param=f"tools[{i}]",
            )
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise BadRequestError(
                f"tools[{i}].function.name must be 1-64 letters, digits, '_', '-' or '.', got {name!r}",
                param=f"tools[{i}].function.name",
            )
        if name in names:
            raise BadRequestError(
                f"tools[{i}]: a second function named {name!r}", param=f"tools[{i}].function.name"
            )
        names.add(name)
        if "parameters" in fn:
            _check_schema(fn["parameters"], f"tools[{i}].function.parameters")
    return tools


def plan_tools(req: ChatCompletionRequest, parser_name: str) -> ToolPlan:
    tools = _validate_tools(list(req.tools or []))
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    forced: str | None = None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise BadRequestError(
                "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        if name not in {t["function"]["name"] for t in tools}:
            raise BadRequestError(
                f"tool_choice names the function {name!r}, which is not among the request's tools",
                param="tool_choice",
            )
        forced = name
    elif choice == "required":
        forced = "required"
    elif choice not in ("none", "auto"):
        raise BadRequestError(
            f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
            param="tool_choice",
        )
    if forced is not None and not tools:
        raise BadRequestError(
            f"tool_choice={choice!r} needs tools; send the functions in tools", param="tool_choice"
        )
    if choice == "none" or not tools:
        return ToolPlan(tools, None, True, None)
    parallel = req.parallel_tool_calls is not False
    return ToolPlan(tools, get_parser(parser_name, tools), parallel, forced)


def several_calls(plan: ToolPlan) -> bool:
    """Whether a forced reply may hold more than one call: `required` with parallel calls allowed."""
    return plan.forced == "required" and plan.parallel


def _lark_literal(text: str) -> str:
    return json.dumps(text)


def forced_call_grammar(plan: ToolPlan) -> StructuredOutputsParams:
    """A Lark grammar whose every sentence is one call in the parser's format (or, for `required` with parallel
    calls, several), each function's arguments constrained by its parameter schema. A named function is
    called exactly once, as vLLM does: the model cannot repeat it."""
    assert plan.parser is not None and plan.forced is not None
    names = [t["function"]["name"] for t in plan.tools]
    if plan.forced != "required":
        names = [plan.forced]
    rules = []
    alts = []
    for i, name in enumerate(names):
        fn = next(t["function"] for t in plan.tools if t["function"]["name"] == name)
        delims = plan.parser.call_delimiters(name)
        if delims is None:
            raise BadRequestError(
                f"tool_choice={plan.forced!r} needs a JSON tool-call format; the server's parser "
                f"{plan.parser.name!r} writes none (start it with --tool-call-parser hermes)",
                param="tool_choice",
            )
        schema = dict(fn.get("parameters") or {"type": "object"})
        schema["x-guidance"] = JSON_OPTIONS  # compact JSON, as for response_format
        rules.append(f"call{i}: {_lark_literal(delims[0])} args{i} {_lark_literal(delims[1])}")
        rules.append(f"args{i}: %json {json.dumps(schema)}")
        alts.append(f"call{i}")
    start = "start: call" + (' ("\\n" call)*' if several_calls(plan) else "")
    grammar = "\n".join([start, "call: " + " | ".join(alts), *rules])
    return check_structured(StructuredOutputsParams(grammar=grammar), "tools")


def prompt_messages(
    plan: ToolPlan, messages: list[dict[str, Any]], template_renders_tools: bool
) -> list[dict[str, Any]]:
    """Messages for the chat template. A template that does not render tools gets them in the system message,
    and earlier calls and their results as text in the parser's format."""
    parser = plan.parser or get_parser("hermes")
    out = []
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            for c in calls:
                fn = c.get("function", {})
                if template_renders_tools and isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
            if not template_renders_tools:
                text = parser.render_calls(calls)
                m["content"] = ((m.get("content") or "") + "\n" + text).strip()
                m.pop("tool_calls")
        if m.get("role") == "tool" and not template_renders_tools:
            m["content"] = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
        out.append(m)
    if plan.in_prompt and not template_renders_tools:
        section = parser.tools_prompt(plan.tools)
        if out and out[0].get("role") == "system":
            out[0] = dict(out[0], content=f"{out[0].get('content') or ''}\n\n{section}".strip())
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def missing_call(plan: ToolPlan, finish_reason: str | None) -> ServerError:
    """The error for a reply without a tool call although `tool_choice` forced one (never a 200)."""
    forced = "a call" if plan.forced == "required" else f"a call of {plan.forced!r}"
    if finish_reason == "length":
        return BadRequestError(
            f"tool_choice forced {forced}, and max_tokens ran out before the call was complete; raise max_tokens",
            param="max_tokens",
        )
    return ToolCallMissingError(
        f"tool_choice forced {forced}, but the reply holds no tool call (it ended with finish_reason "
        f"{finish_reason!r})"
    )


def message_fields(
    plan: ToolPlan, text: str, finish_reason: str | None
) -> tuple[str | None, list | None, str | None]:
    """(content, tool_calls, finish_reason) of a whole reply."""
    if plan.parser is None:
        return text, None, finish_reason
    content, calls = plan.parser.parse(text)
    if not calls:
        return text, None, finish_reason
    if not plan.parallel:
        calls = calls[:1]
    return (
        (content or None),
        [c.to_openai() for c in calls],
        "tool_calls" if finish_reason == "stop" else finish_reason,
    )
