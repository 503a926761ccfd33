"""`tool_choice: "required"` with parallel calls: the reply ends where the model repeats a call.

The forced grammar admits `call ("\\n" call)*`, so after each call the model may only call again or end. A model
that would rather write prose after its call (SmolLM2 writes "\\n\\nThe weather in Paris is ...") is left with
the next call as its likeliest way on, and greedy decoding then writes the same call again, until `max_tokens`.
Several calls stay allowed (the weather in Paris and in London are two calls), but a call that repeats an
earlier one of the same reply, the same function with the same arguments as written, ends the reply before
it: it is never shown, the choice finishes with `tool_calls`, and the engine stops generating once every
choice has finished or repeated itself. While the text since the last complete call could still become such a
repeat, it is held back from a stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from vriksha.engine.outputs import CompletionOutput, RequestOutput
from vriksha.server.tools import ToolPlan, several_calls

_DECODER = json.JSONDecoder()
SEPARATOR = "\n"  # between two calls of the forced grammar (`forced_call_grammar`)
REPEATED = "repeated tool call"  # the stop_reason of a choice that ended at a repeat


@dataclass(frozen=True, slots=True)
class Shown:
    """How much of a choice's text a client sees: `text[:end]`; `repeated`: the reply ends there."""

    end: int
    repeated: bool


def _call_end(text: str, pos: int, delimiters: dict[str, tuple[str, str]]) -> int | None:
    """The end of the complete call that starts at `pos`, or None (no call there, or not complete yet)."""
    for opening, closing in delimiters.values():
        if not text.startswith(opening, pos):
            continue
        try:
            _, end = _DECODER.raw_decode(text, pos + len(opening))
        except json.JSONDecodeError:
            return None
        return end + len(closing) if text.startswith(closing, end) else None
    return None


def shown(text: str, delimiters: dict[str, tuple[str, str]]) -> Shown:
    """What of a forced reply's `text` (calls joined by SEPARATOR) may be shown: all of it, up to the first call
    that repeats an earlier one, or up to the last complete call while what follows could become a repeat."""
    calls: list[str] = []
    pos = done = 0
    while (end := _call_end(text, pos, delimiters)) is not None:
        call = text[pos:end]
        if call in calls:
            return Shown(max(pos - len(SEPARATOR), 0), True)
        calls.append(call)
        done = end
        if not text.startswith(SEPARATOR, end):
            break
        pos = end + len(SEPARATOR)
    tail = text[done:]
    if tail and any((SEPARATOR + call).startswith(tail) for call in calls):
        return Shown(done, False)
    return Shown(len(text), False)


class RepeatGuard:
    """The choices of one forced reply as a client sees them (see the module's docstring)."""

    def __init__(self, plan: ToolPlan) -> None:
        assert plan.parser is not None
        self.active = several_calls(plan)
        self.delimiters: dict[str, tuple[str, str]] = {}
        for tool in plan.tools if self.active else ():
            name = tool["function"]["name"]
            delims = plan.parser.call_delimiters(name)
            if delims is not None:
                self.delimiters[name] = delims

    def view(self, c: CompletionOutput) -> CompletionOutput:
        """`c` cut before a repeated call (then finished with "stop", which a reply with calls reports as
        "tool_calls"), or, while it runs, without the text that could still become one."""
        if not self.active:
            return c
        s = shown(c.text, self.delimiters)
        if s.repeated:
            return replace(c, text=c.text[: s.end], finish_reason="stop", stop_reason=REPEATED)
        if c.finished or s.end == len(c.text):
            return c
        return replace(c, text=c.text[: s.end])

    def settled(self, out: RequestOutput) -> bool:
        """Whether every choice has finished or repeated a call: nothing more of the request will be shown."""
        return self.active and all(c.finished or shown(c.text, self.delimiters).repeated for c in out.outputs)
