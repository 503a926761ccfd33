"""What plays episodes: the engine that `play_groups` sends every turn to.

The colocated `vriksha.LLM` and the trainer's client of `vriksha serve` processes
(`train/server_rollout.py`) both implement it; so can a test double. The trainer's engine adds the
weight-version calls (`train/rollout_engine.py` `TrainingEngine`).

An engine with sessions (`SessionEngine`: `generate(..., session_id=...)` and `close_session`) keeps a session's
prefix pinned in its cache between turns; the episode driver makes every episode one. Session ids of the form
`family/member` continue `family`'s prefix (an episode's session continues its group's first turn):
`session_family` is what a client that spreads sessions over several servers keeps on one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from vriksha import RequestOutput, SamplingParams

__all__ = [
    "PassThroughEngine",
    "RolloutEngine",
    "SessionEngine",
    "SessionIds",
    "TokenPrompt",
    "session_family",
]

TokenPrompt = dict[str, list[int]]  # {"prompt_token_ids": [...]}: a prompt as the engine's own token ids
SessionIds = str | Sequence[str | None] | None  # the session of every prompt, or of each (None: no session)


@runtime_checkable
class RolloutEngine(Protocol):
    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids that end a completion (a turn that ends on one is closed without another EOS)."""
        ...

    def generate(
        self,
        prompts: Sequence[TokenPrompt],
        sampling_params: Sequence[SamplingParams],
        /,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One finished `RequestOutput` per prompt, in order, each with `SamplingParams.n` completions
        carrying their token ids and (when asked for) the sampled tokens' log-probabilities."""
        ...


@runtime_checkable
class SessionEngine(RolloutEngine, Protocol):
    def generate(
        self,
        prompts: Sequence[TokenPrompt],
        sampling_params: Sequence[SamplingParams],
        /,
        use_tqdm: bool = False,
        session_id: SessionIds = None,
    ) -> list[RequestOutput]:
        """As `RolloutEngine.generate`; a prompt with a session keeps its K/V pinned after it finishes, until
        the session's next turn, `close_session` or the engine's session timeout."""
        ...

    def close_session(self, session_id: str) -> bool:
        """End a session (its pinned prefix becomes ordinary cache); False when it was not open."""
        ...


def session_family(session_id: str) -> str:
    """The session id's part before its first `/`: the sessions of one family share a prefix."""
    return session_id.split("/", 1)[0]


class PassThroughEngine:
    """A `SessionEngine` over another engine: `generate` goes to `inner`, and `observe(outputs)` (nothing here)
    watches what comes back; a wrapper overrides `observe` or adds calls of its own. Sessions go to `inner`
    when it has them; over an engine without, requests go without their sessions and nothing is closed."""

    def __init__(self, inner: RolloutEngine) -> None:
        self.inner = inner

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.inner.eos_token_ids

    def generate(
        self,
        prompts: Sequence[TokenPrompt],
        sampling_params: Sequence[SamplingParams],
        /,
        use_tqdm: bool = False,
        session_id: SessionIds = None,
    ) -> list[RequestOutput]:
        if session_id is not None and isinstance(self.inner, SessionEngine):
            outputs = self.inner.generate(prompts, sampling_params, use_tqdm=use_tqdm, session_id=session_id)
        else:
            outputs = self.inner.generate(prompts, sampling_params, use_tqdm=use_tqdm)
        self.observe(outputs)
        return outputs

    def close_session(self, session_id: str) -> bool:
        if isinstance(self.inner, SessionEngine):
            return self.inner.close_session(session_id)
        return False

    def observe(self, outputs: list[RequestOutput]) -> None:
        pass
