"""/v1/responses on the chat path: input items -> chat messages (the chat template renders them), the
Responses tools, tool_choice and text.format -> their chat forms, and a reply -> output items.

Input items: a string (one user message), or a list of messages (`{"role", "content"}`, `type: "message"`
optional; content a string or input_text / output_text parts), `function_call` items (the assistant's
earlier calls) and `function_call_output` items (their results, as tool messages). Reasoning items are
accepted and left out of the prompt, as chat templates drop earlier turns' reasoning.
"""

from __future__ import annotations

import uuid
from typing import Any

from vriksha.server.errors import BadRequestError
from vriksha.server.protocol import ChatCompletionRequest, EngineExtras
from vriksha.server.protocol_responses import ResponsesRequest

_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
_ROLES = ("user", "system", "developer", "assistant")
_REFUSED = {
    "background": "responses run in the foreground; omit background",
    "conversation": "conversations are not stored; chain responses with previous_response_id instead",
    "prompt": "stored prompt templates do not exist here; send input and instructions",
    "max_tool_calls": "built-in tools do not exist here; omit max_tool_calls",
    "top_logprobs": "log-probabilities are not returned by /v1/responses; use /v1/chat/completions",
}


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _bad(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise _bad(
                f"{where}[{i}]: content part of type {kind!r} is not supported; this model takes text only "
                "(input_text or output_text parts)",
                f"{where}[{i}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]], where: str = "input") -> list[dict[str, Any]]:
    """Input items as chat messages. Consecutive function_call items join one assistant message (after the
    assistant's text, when it came just before)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{at} must be an object (a message or a function call item)", at)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{at}.role must be one of {', '.join(_ROLES)}, got {role!r}", f"{at}.role")
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), f"{at}.content"),
                }
            )
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
                raise _bad(f"{at}: a function_call item needs call_id, name and arguments (strings)", at)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif (
                last is not None
                and last["role"] == "assistant"
                and items[i - 1].get("type", "message") == "message"
            ):
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _bad(
                    f"{at}.call_id must be the call_id of the function_call it answers", f"{at}.call_id"
                )
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(output, f"{at}.output")})
        elif kind == "reasoning":
            continue
        else:
            raise _bad(
                f"{at}: input items of type {kind!r} are not supported; send messages, function_call and "
                "function_call_output items",
                f"{at}.type",
            )
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (`{"type": "function", "name", "parameters", ...}`) in the chat form."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(
                f"tools[{i}] has type {kind!r}; only function tools exist here ({{'type': 'function', "
                "'name': ..., 'parameters': {...}}})",
                f"tools[{i}]",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise _bad(
                "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                "tool_choice",
            )
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format -> response_format: text, json_object, or json_schema (its name, schema and strict)."""
    if not text:
        return None
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format must be an object with a type", "text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise _bad(
        f"text.format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}", "text.format"
    )


def check_support(req: ResponsesRequest) -> None:
    """Refuse, by name, what this server cannot honour."""
    for name, why in _REFUSED.items():
        if getattr(req, name) is not None:
            raise BadRequestError(f"{name} is not supported by this server: {why}", param=name)
    if req.truncation not in (None, "disabled"):
        raise BadRequestError(
            "truncation='auto' is not supported: a conversation too long for the context gets a 400; "
            "omit truncation or send 'disabled'",
            param="truncation",
        )
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        raise BadRequestError(
            "reasoning options are not supported: the effort and summaries of a model's reasoning cannot be "
            "steered here (a --reasoning-parser returns the reasoning it writes); omit reasoning",
            param="reasoning",
        )
    if req.service_tier not in (None, "auto", "default"):
        raise BadRequestError(
            "there is one service tier; omit service_tier or send 'auto'", param="service_tier"
        )


def chat_request(
    req: ResponsesRequest, history: list[dict[str, Any]]
) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request a Responses request stands for, and the conversation without the instructions (what
    a later response continues: instructions are not carried over, as in OpenAI's API)."""
    check_support(req)
    conversation = history + input_messages(req.input)
    if not conversation:
        raise _bad("input is empty and there is no previous_response_id to continue; send input", "input")
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    body: dict[str, Any] = req.model_dump(include=set(EngineExtras.model_fields), exclude_none=True)
    body.update(
        model=req.model,
        messages=messages,
        tools=chat_tools(req.tools),
        tool_choice=chat_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=chat_response_format(req.text),
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
    )
    if req.structured_outputs is not None:  # a pydantic model: back to its wire form
        body["structured_outputs"] = req.structured_outputs.model_dump(exclude_none=True, by_alias=True)
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValueError as exc:
        raise _bad(f"the input items do not make a valid conversation: {exc}", "input") from None
    return chat, conversation


# --- output ---


def reasoning_item(text: str, rid: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": rid or item_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str | None, mid: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": mid or item_id("msg"),
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [output_text_part(text)],
    }


def function_call_item(
    call_id: str, name: str, arguments: str, fid: str | None = None, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": fid or item_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(
    reasoning: str | None, content: str | None, calls: list[dict[str, Any]] | None
) -> list[dict]:
    """A whole reply's items: its reasoning, its text, its calls (chat `tool_calls` entries)."""
    items = []
    if reasoning is not None:
        items.append(reasoning_item(reasoning))
    if content:
        items.append(message_item(content))
    for c in calls or []:
        items.append(function_call_item(c["id"], c["function"]["name"], c["function"]["arguments"]))
    return items


def items_as_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the chat messages a follow-up's prompt holds."""
    return input_messages([i for i in items if i["type"] != "reasoning"], "output")


def response_usage(
    prompt_tokens: int, cached: int, output_tokens: int, reasoning_tokens: int
) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt_tokens + output_tokens,
    }


def response_body(
    req: ResponsesRequest,
    rid: str,
    created_at: int,
    model: str,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """The Response object, with the request's settings echoed as OpenAI does."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store is not False,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
        "metadata": req.metadata or {},
    }
