"""What the scheduler hands the model runner for one step: decode requests, prefill chunks and draft runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from vriksha.engine.core.request import Request


@dataclass(slots=True)
class PrefillChunk:
    request: Request
    start: int  # first token position computed in this chunk
    end: int  # one past the last
    sample: bool  # the chunk reaches the last token: sample the next one


@dataclass(slots=True)
class DraftRun:
    """A decode with speculative tokens: the request's next token and `draft` after it are computed at
    positions start .. start + len(draft), and every one of those positions is sampled."""

    request: Request
    start: int  # the request's num_computed when scheduled
    draft: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.draft) + 1

    @property
    def token_ids(self) -> list[int]:
        return [self.request.all_token_ids[self.start], *self.draft]


@dataclass(slots=True)
class ForwardBatch:
    decodes: list[Request]  # one new token each, at position num_computed
    prefills: list[PrefillChunk]
    drafts: list[DraftRun] = field(default_factory=list)  # their logits rows come last, in order

    @property
    def num_tokens(self) -> int:
        return (
            len(self.decodes)
            + sum(c.end - c.start for c in self.prefills)
            + sum(r.num_tokens for r in self.drafts)
        )

    @property
    def num_draft_rows(self) -> int:
        return sum(r.num_tokens for r in self.drafts)

    def row_lora_ids(self) -> list[int]:
        """The adapter id of every row of the step, in the step's row order (decodes, prefill chunks, drafts)."""
        ids = [r.lora_id for r in self.decodes]
        for c in self.prefills:
            ids.extend([c.request.lora_id] * (c.end - c.start))
        for run in self.drafts:
            ids.extend([run.request.lora_id] * run.num_tokens)
        return ids

    @property
    def has_lora(self) -> bool:
        return any(r.lora_id for r in self.decodes) or any(
            c.request.lora_id for c in (*self.prefills, *self.drafts)
        )

    @property
    def sampled_requests(self) -> list[Request]:
        return self.decodes + [c.request for c in self.prefills if c.sample]
