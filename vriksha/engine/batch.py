"""What the scheduler hands the model runner for one step: decode requests and prefill chunks."""

from __future__ import annotations

from dataclasses import dataclass

from vriksha.engine.request import Request


@dataclass(slots=True)
class PrefillChunk:
    request: Request
    start: int  # first token position computed in this chunk
    end: int  # one past the last
    sample: bool  # the chunk reaches the last token: sample the next one


@dataclass(slots=True)
class ForwardBatch:
    decodes: list[Request]  # one new token each, at position num_computed
    prefills: list[PrefillChunk]

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.end - c.start for c in self.prefills)

    @property
    def sampled_requests(self) -> list[Request]:
        return self.decodes + [c.request for c in self.prefills if c.sample]
