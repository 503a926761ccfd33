"""Reasoning parsers by name (vLLM's names)."""

from __future__ import annotations

from vriksha.errors import ConfigError
from vriksha.reasoning.parser import ReasoningParser


class Qwen3Parser(ReasoningParser):
    name = "qwen3"


class SmolLM3Parser(ReasoningParser):
    name = "smollm3"


class DeepSeekR1Parser(ReasoningParser):
    """R1 distills: the chat template may end the prompt with `<think>`, so the reply starts reasoning."""

    name = "deepseek_r1"
    opening_in_prompt = True


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    p.name: p for p in (Qwen3Parser, SmolLM3Parser, DeepSeekR1Parser)
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    try:
        return REASONING_PARSERS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown reasoning parser {name!r}; choose one of {', '.join(sorted(REASONING_PARSERS))}"
        ) from None
