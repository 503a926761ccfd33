"""A request as JSON: the text routing looks at, and the changes a decision makes before forwarding."""

from __future__ import annotations

import copy
from typing import Any

from vriksha.router.semantic.config import Changes


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def routing_text(body: dict[str, Any]) -> str:
    """The last user message of a chat, or the (first) prompt of a completion; "" for token ids."""
    if "messages" in body:
        for m in reversed(body["messages"]):
            if isinstance(m, dict) and m.get("role") == "user":
                return _text(m.get("content"))
        return ""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ""


def apply(body: dict[str, Any], changes: Changes | None, model: str) -> dict[str, Any]:
    """A copy of `body` for the pool: its model name, the system prompt, the sampling overrides, the
    reasoning switch (chat only: system prompts and reasoning have no meaning for raw completions)."""
    out = copy.deepcopy(body)
    out["model"] = model
    if changes is None:
        return out
    out.update(changes.sampling)
    if "messages" not in out:
        return out
    if changes.system_prompt is not None:
        msgs = out["messages"]
        first = msgs[0] if msgs else None
        if isinstance(first, dict) and first.get("role") in ("system", "developer"):
            if changes.system_prompt_mode == "replace":
                msgs[0] = {**first, "content": changes.system_prompt}
            else:
                msgs[0] = {**first, "content": changes.system_prompt + "\n\n" + _text(first.get("content"))}
        else:
            msgs.insert(0, {"role": "system", "content": changes.system_prompt})
    if changes.reasoning is not None:
        kwargs = dict(out.get("chat_template_kwargs") or {})
        kwargs["enable_thinking"] = changes.reasoning
        out["chat_template_kwargs"] = kwargs
    return out


def sampled(body: dict[str, Any]) -> bool:
    """Whether the answer is drawn at random: temperature > 0, or unset (the default is 1)."""
    t = body.get("temperature")
    return t is None or float(t) > 0.0 or int(body.get("n") or 1) > 1
