"""Prompts: completions' four prompt shapes, and chat messages rendered with the tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vriksha.server.errors import BadRequestError
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest
from vriksha.server.tools import ToolPlan, prompt_messages
from vriksha.toolcalls import template_renders_tools


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids -> one entry per prompt."""
    p = req.prompt
    if isinstance(p, str):
        prompts: list[str | list[int]] = [p]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [list(p)]  # type: ignore[arg-type]
    else:
        prompts = list(p)  # type: ignore[arg-type]
    if not prompts or any(len(x) == 0 for x in prompts):
        raise BadRequestError(
            "prompt must not be empty; send a non-empty string or list of token ids", param="prompt"
        )
    return prompts


def _text_content(content: str | list[dict[str, Any]] | None, index: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts: list[str] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise BadRequestError(
                f"messages[{index}].content: content part of type {kind!r} is not supported; this model takes text only",
                param=f"messages[{index}].content",
            )
    return "\n".join(texts)


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The request's messages as dicts: text content only, `developer` as `system`."""
    out = []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True)
        d["content"] = _text_content(m.content, i) or ""
        if d["role"] == "developer":  # OpenAI's newer name for system
            d["role"] = "system"
        out.append(d)
    return out


def _bos_added(tokenizer: Any) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer.encode("a", add_special_tokens=True)
    return bool(ids) and ids[0] == bos


def render_chat(
    tokenizer: Any,
    req: ChatCompletionRequest,
    plan: ToolPlan | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> list[int]:
    """Chat template -> text -> token ids. The template writes its own special tokens, so encode adds none,
    except a BOS the tokenizer always adds and the template left out. Tools reach the template when it renders
    them, else the system message (`server/tools.py`). `encode`: text -> ids without special tokens (default:
    the tokenizer's; a server passes its `PromptEncoder.encode`, which refuses a text far past the context)."""
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequestError(
            "this model's tokenizer has no chat template; use /v1/completions with a plain prompt"
        )
    kwargs = dict(req.chat_template_kwargs or {})
    messages = chat_messages(req)
    if plan is not None:
        renders = template_renders_tools(tokenizer.chat_template)
        messages = prompt_messages(plan, messages, renders)
        if plan.in_prompt and renders:
            kwargs["tools"] = plan.tools
    add_generation_prompt = req.add_generation_prompt
    if req.continue_final_message:
        if req.messages[-1].role != "assistant":
            raise BadRequestError(
                "continue_final_message=true needs an assistant message last, to continue",
                param="continue_final_message",
            )
        kwargs["continue_final_message"] = True
        add_generation_prompt = False
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
        )
    except BadRequestError:
        raise
    except Exception as exc:  # jinja errors: raise_exception() in templates, bad roles or orders
        raise BadRequestError(f"the chat template rejected these messages: {exc}", param="messages") from exc
    ids = encode(text) if encode is not None else tokenizer.encode(text, add_special_tokens=False)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and not text.startswith(bos) and _bos_added(tokenizer):
        ids = [tokenizer.bos_token_id, *ids]
    return ids
