"""One sequence being generated: its tokens, KV bookkeeping and stop state."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vriksha.engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vriksha.engine.core.radix_cache import TreeNode


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A single sequence. A user request with `n > 1` becomes n of these, sharing the prompt."""

    request_id: str  # the user request's id
    index: int  # which of its n samples
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    prompt: str | None = None
    lora_id: int = 0  # the engine's id of the adapter (name and version) it runs with; 0: the base model
    lora_name: str | None = None
    session_id: str | None = None  # the session it continues: its K/V stays pinned after it finishes
    arrival_time: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None  # why the sequence ended, when it ended as an error (finish_reason "error")
    # KV bookkeeping
    row: int | None = None  # request-to-token table row while admitted
    num_computed: int = 0  # tokens whose K/V sit in the pool (prefix from the cache included)
    cached_len: int = 0  # leading tokens whose slots belong to the radix tree (shared, locked)
    cache_node: TreeNode | None = None
    num_cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    admitted_once: bool = False
    seed: int | None = None  # the sequence's own seed: its draws depend on (seed, position) only
    bad_word_ids: list[list[int]] = field(default_factory=list)  # token sequences never to complete
    grammar: Any = None  # a structured-output matcher (vriksha.engine.core.grammar.Matcher) when constrained
    prompt_logprobs: dict[int, dict[int, float]] = field(default_factory=dict)  # position -> {token: lp}
    first_token_time: float | None = None
    # detokenisation state
    text: str = ""
    _stop_checked_len: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def uncomputed(self) -> int:
        return self.num_tokens - self.num_computed
