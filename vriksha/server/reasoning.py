"""The --reasoning-parser in the server: the prompt's tail it looks at, and structured outputs that apply to
the answer after an optional reasoning block rather than to the reply's first token."""

from __future__ import annotations

import json
import re
from typing import Any

from vriksha.engine.core.grammar import JSON_OPTIONS
from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.reasoning import ReasoningParser
from vriksha.server.sampling import check_structured

_PROMPT_TAIL_TOKENS = 8  # enough tokens to hold an opening tag and the whitespace after it


def prompt_tail(tokenizer: Any, prompt_ids: list[int]) -> str:
    """The end of the prompt as text: a parser whose template opens the reasoning block looks at it."""
    return tokenizer.decode(prompt_ids[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)


def _answer_rule(spec: StructuredOutputsParams) -> str | None:
    """The Lark rule `answer` matching what `spec` asks for, or None for a grammar of the client's own."""
    if spec.json is not None or spec.json_object:
        schema = dict(spec.json) if isinstance(spec.json, dict) else {"type": "object"}
        schema["x-guidance"] = JSON_OPTIONS
        return f"answer: %json {json.dumps(schema)}"
    if spec.regex is not None:
        return "answer: /" + re.sub(r"(?<!\\)/", r"\\/", spec.regex) + "/"
    if spec.choice is not None:
        return "answer: " + " | ".join(json.dumps(c) for c in spec.choice)
    return None


def lark_answer(grammar: str) -> str:
    """A Lark grammar of ours whose start rule is renamed `answer` (to be wrapped by `after_reasoning`)."""
    return re.sub(r"^start:", "answer:", grammar, count=1, flags=re.M)


def after_reasoning(
    spec: StructuredOutputsParams, parser: ReasoningParser, opened: bool = False, own_lark: bool = False
) -> StructuredOutputsParams:
    """`spec`, preceded by an optional reasoning block (opening tag, any text without the closing tag, the
    closing tag, whitespace); `opened`: the prompt opened the block, so the reply starts inside it and must
    close it. A client's own grammar (`spec.grammar`, unless `own_lark`: one the server wrote with a `start`
    rule) is left as it is: it applies from the reply's first token."""
    if spec.grammar is not None:
        if not own_lark:
            return spec
        rule = lark_answer(spec.grammar)
    else:
        answer = _answer_rule(spec)
        if answer is None:
            return spec
        rule = answer
    opening = "" if opened else json.dumps(parser.start) + " "
    think = (
        f"start: think{'' if opened else '?'} answer\n"
        f"think: {opening}think_text /[ \\t\\r\\n]*/\n"
        f"think_text[stop={json.dumps(parser.end)}]: /(.|\\n)*/\n"
    )
    return check_structured(StructuredOutputsParams(grammar=think + rule), "structured_outputs")
