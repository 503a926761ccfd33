"""Reasoning output: the `<think>...</think>` block a reasoning model writes before its answer, split out of
the reply (whole or streamed) so that servers can return it apart from the answer."""

from vriksha.reasoning.parser import ReasoningParser, ReasoningSplit, ReasoningStream
from vriksha.reasoning.registry import REASONING_PARSERS, get_reasoning_parser

__all__ = [
    "REASONING_PARSERS",
    "ReasoningParser",
    "ReasoningSplit",
    "ReasoningStream",
    "get_reasoning_parser",
]
