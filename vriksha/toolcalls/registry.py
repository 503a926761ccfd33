"""Parsers by name, and the choice of one from a chat template (an explicit `--tool-call-parser` wins)."""

from __future__ import annotations

import logging
from typing import Any

from vriksha.errors import ConfigError
from vriksha.toolcalls.base import IdFactory, ToolParser
from vriksha.toolcalls.hermes import HermesParser
from vriksha.toolcalls.llama3 import Llama3JsonParser
from vriksha.toolcalls.qwen import QwenParser
from vriksha.toolcalls.qwen3_coder import Qwen3CoderParser
from vriksha.toolcalls.types import new_call_id

logger = logging.getLogger(__name__)

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen": QwenParser,  # Qwen2.5 / Qwen3: Hermes blocks, or bare call objects
    "llama3_json": Llama3JsonParser,
    "qwen3_coder": Qwen3CoderParser,
}
DEFAULT_PARSER = "hermes"


def get_parser(
    name: str, tools: list[dict[str, Any]] | None = None, id_factory: IdFactory = new_call_id
) -> ToolParser:
    try:
        cls = PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tool-call parser {name!r}; choose one of {', '.join(sorted(PARSERS))}"
        ) from None
    return cls(tools, id_factory)


def template_renders_tools(chat_template: str | None) -> bool:
    """Whether the template itself writes the request's `tools` into the prompt."""
    return bool(chat_template) and "tools" in chat_template


def parser_for_template(chat_template: str | None, override: str | None = None) -> str:
    """The parser name for a model: `override` when given, else the convention the template writes.

    Templates that define no convention (no tools in them, like SmolLM2's) get Hermes blocks, which the
    server then describes to the model in the system message.
    """
    if override:
        get_parser(override)  # validates the name
        return override
    t = chat_template or ""
    if "<function=" in t and "<parameter=" in t:
        return "qwen3_coder"
    if "<tool_call>" in t:
        return "qwen" if "Qwen" in t or "qwen" in t else "hermes"
    if "<|python_tag|>" in t or "ipython" in t or '"parameters": ' in t:
        return "llama3_json"
    if template_renders_tools(t):
        logger.info(
            "chat template renders tools in a convention vriksha does not know; using %s", DEFAULT_PARSER
        )
    return DEFAULT_PARSER
