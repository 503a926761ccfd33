"""What plays episodes: the engine that `play_groups` sends every turn to.

The colocated `vriksha.LLM` and the trainer's client of `vriksha serve` processes
(`train/server_rollout.py`) both implement it; so can a test double. The trainer's engine adds the
weight-version calls (`train/rollout_engine.py` `TrainingEngine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from vriksha import RequestOutput, SamplingParams

__all__ = ["PassThroughEngine", "RolloutEngine", "TokenPrompt"]

TokenPrompt = dict[str, list[int]]  # {"prompt_token_ids": [...]}: a prompt as the engine's own token ids


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


class PassThroughEngine:
    """A `RolloutEngine` over another: `generate` goes to `inner`, and `observe(outputs)` (nothing here) watches
    what comes back; a wrapper overrides `observe` or adds calls of its own."""

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
    ) -> list[RequestOutput]:
        outputs = self.inner.generate(prompts, sampling_params, use_tqdm=use_tqdm)
        self.observe(outputs)
        return outputs

    def observe(self, outputs: list[RequestOutput]) -> None:
        pass
