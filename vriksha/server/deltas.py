"""What each choice of a stream of cumulative outputs adds since the last one: the delta loop of every
streaming endpoint (chat, completions, native /generate), written once."""

from __future__ import annotations

from dataclasses import dataclass

from vriksha.engine.core.outputs import CompletionOutput


def text_delta(text: str, sent: int, finished: bool) -> str:
    """The new part of a cumulative text. While running, a trailing U+FFFD (a multi-byte character cut between
    tokens) is held back until the next token completes it."""
    end = len(text)
    if not finished:
        while end > sent and text[end - 1] == "\ufffd":
            end -= 1
    return text[sent:end] if end > sent else ""


@dataclass(slots=True)
class ChoiceDelta:
    index: int  # the choice's index in the response
    output: CompletionOutput  # the cumulative output it came from
    text: str  # new text
    text_start: int  # characters sent before
    token_start: int  # tokens sent before

    @property
    def token_ids(self) -> list[int]:
        return self.output.token_ids[self.token_start :]

    @property
    def finish_reason(self) -> str | None:
        return self.output.finish_reason


class DeltaTracker:
    """Remembers what was sent of each choice; a finished choice is reported once."""

    def __init__(self) -> None:
        self._text: dict[int, int] = {}
        self._tokens: dict[int, int] = {}
        self._finished: set[int] = set()

    def advance(self, index: int, output: CompletionOutput) -> ChoiceDelta | None:
        """What `output` (choice `index`) adds, or None when it adds nothing."""
        if index in self._finished:
            return None
        t0, k0 = self._text.get(index, 0), self._tokens.get(index, 0)
        finished = output.finish_reason is not None
        text = text_delta(output.text, t0, finished)
        if not text and not finished and len(output.token_ids) == k0:
            return None
        self._text[index] = t0 + len(text)
        self._tokens[index] = len(output.token_ids)
        if finished:
            self._finished.add(index)
        return ChoiceDelta(index, output, text, t0, k0)
