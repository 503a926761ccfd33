"""One tool-call parser for the server, the environments and the trainer.

`get_parser(name, tools)` gives a `ToolParser`: `parse(text) -> (content, calls)` for a whole reply and
`stream()` for an incremental parser producing OpenAI `tool_calls` deltas whose reassembly equals `parse`.
`parser_for_template(chat_template, override)` picks the convention a model's chat template uses.
"""

from vriksha.toolcalls.base import ToolCallStream, ToolParser
from vriksha.toolcalls.registry import (
    DEFAULT_PARSER,
    PARSERS,
    get_parser,
    parser_for_template,
    template_renders_tools,
)
from vriksha.toolcalls.types import ContentDelta, Delta, ToolCall, ToolCallDelta, assemble, new_call_id

__all__ = [
    "DEFAULT_PARSER",
    "PARSERS",
    "ContentDelta",
    "Delta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "assemble",
    "get_parser",
    "new_call_id",
    "parse_tool_calls",
    "parser_for_template",
    "template_renders_tools",
]


def parse_tool_calls(
    text: str, parser: str = DEFAULT_PARSER, tools: list | None = None
) -> tuple[str, list[ToolCall]]:
    """`get_parser(parser, tools).parse(text)`: the reply's content and its calls."""
    return get_parser(parser, tools).parse(text)
