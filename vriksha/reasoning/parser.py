"""Split `<think>reasoning</think>answer` into its reasoning and its answer, whole or piece by piece.

A reply is in one of three states: at its start (leading whitespace, then perhaps the opening tag), inside
the reasoning (until the closing tag), or in the answer. A streamed piece may end inside a tag, so a tail that
could still become a tag is held back until the next piece (or the end) decides it.

- No opening tag at the start: the whole reply is the answer.
- An opening tag without a closing one (the reply was cut off while reasoning): all of it is reasoning.
- `opening_in_prompt` (DeepSeek-R1 distills: their chat template ends the prompt with `<think>`): when the
  prompt ends with the opening tag, the reply starts inside the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ReasoningSplit:
    """What a reply (or a piece of a streamed one) holds: reasoning text and answer text."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag` (it may complete next piece)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningStream:
    """One reply's pieces in, (reasoning, answer) pieces out."""

    def __init__(self, start: str, end: str, in_reasoning: bool = False) -> None:
        self.start, self.end = start, end
        self._state = "reasoning" if in_reasoning else "start"
        self._buffer = ""
        self._answer_started = False  # whitespace right after the closing tag is dropped
        self.saw_reasoning = in_reasoning

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    def feed(self, text: str, final: bool = False) -> ReasoningSplit:
        """What `text` adds; `final`: it is the reply's last piece (nothing is held back then)."""
        piece = self._feed(text)
        if not final:
            return piece
        end = self.finish()
        return ReasoningSplit(piece.reasoning + end.reasoning, piece.content + end.content)

    def _feed(self, text: str) -> ReasoningSplit:
        self._buffer += text
        reasoning, content = [], []
        while self._buffer:
            if self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(self.start):
                    self._buffer = head[len(self.start) :]
                    self._state = "reasoning"
                    self.saw_reasoning = True
                    continue
                if self.start.startswith(head):  # empty, or a tag still arriving
                    break
                self._state = "answer"
                self._answer_started = True
                continue
            if self._state == "reasoning":
                at = self._buffer.find(self.end)
                if at >= 0:
                    reasoning.append(self._buffer[:at])
                    self._buffer = self._buffer[at + len(self.end) :]
                    self._state = "answer"
                    continue
                keep = _held_prefix(self._buffer, self.end)
                reasoning.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            if not self._answer_started:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    break
                self._answer_started = True
            content.append(self._buffer)
            self._buffer = ""
        return ReasoningSplit("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningSplit:
        """The end of the reply: whatever was held back, as what it turned out to be."""
        rest, self._buffer = self._buffer, ""
        if self._state == "reasoning":
            return ReasoningSplit(reasoning=rest)
        if self._state == "start":
            self._state = "answer"
            return ReasoningSplit(content=rest)
        return ReasoningSplit(content=rest if self._answer_started else rest.lstrip())


class ReasoningParser:
    """A model family's reasoning convention: its tags, and whether its prompt may open the block."""

    name = "think"
    start = "<think>"
    end = "</think>"
    opening_in_prompt = False

    def starts_in_reasoning(self, prompt_text: str | None) -> bool:
        """Whether a reply to this prompt begins inside the reasoning (the template opened the block)."""
        if not self.opening_in_prompt or not prompt_text:
            return False
        tail = prompt_text.rstrip()
        return tail.endswith(self.start)

    def stream(self, prompt_text: str | None = None) -> ReasoningStream:
        return ReasoningStream(self.start, self.end, self.starts_in_reasoning(prompt_text))

    def split(self, text: str, prompt_text: str | None = None) -> tuple[str | None, str]:
        """(reasoning or None when the reply has no reasoning block, answer) of a whole reply."""
        s = self.stream(prompt_text)
        whole = s.feed(text, final=True)
        return (whole.reasoning if s.saw_reasoning else None), whole.content
