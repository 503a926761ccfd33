"""What the engine reports of itself: running and waiting requests, KV use, token counts, speculation, and
how long its steps take."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# upper bounds in seconds of the step-duration histogram's buckets (one more bucket counts the steps above)
STEP_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
# a step is "verify" when it checks speculative drafts, else "prefill" when it carries a prompt chunk (also
# one short enough to run as decode rows), else "decode"
STEP_KINDS = ("decode", "prefill", "verify")


@dataclass(slots=True)
class StepTimes:
    """Engine step durations by kind: counts per bucket of STEP_BUCKETS (the last entry: above them), sums."""

    counts: dict[str, list[int]] = field(
        default_factory=lambda: {k: [0] * (len(STEP_BUCKETS) + 1) for k in STEP_KINDS}
    )
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0.0))

    def observe(self, kind: str, seconds: float) -> None:
        self.counts[kind][bisect.bisect_left(STEP_BUCKETS, seconds)] += 1
        self.sums[kind] += seconds

    def copy(self) -> StepTimes:
        return StepTimes({k: list(v) for k, v in self.counts.items()}, dict(self.sums))

    def since(self, earlier: StepTimes) -> StepTimes:
        """The steps taken after `earlier` (a copy taken before) was read."""
        return StepTimes(
            {k: [a - b for a, b in zip(v, earlier.counts[k], strict=True)] for k, v in self.counts.items()},
            {k: v - earlier.sums[k] for k, v in self.sums.items()},
        )

    def mean(self, kind: str) -> float | None:
        n = self.count(kind)
        return self.sums[kind] / n if n else None

    def count(self, kind: str) -> int:
        return sum(self.counts[kind])

    def quantile(self, kind: str, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile step (inf above the last), None with no step."""
        n = self.count(kind)
        if n == 0:
            return None
        seen = 0
        for i, c in enumerate(self.counts[kind]):
            seen += c
            if seen >= q * n:
                return STEP_BUCKETS[i] if i < len(STEP_BUCKETS) else float("inf")
        return float("inf")


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_used_tokens: int  # slots held by requests and locked cache nodes
    kv_cached_tokens: int  # slots held by unlocked (evictable) prefix-cache nodes
    kv_total_tokens: int
    prompt_tokens: int  # prompt tokens of every admitted request so far
    cached_prompt_tokens: int  # of those, served from the prefix cache
    generation_tokens: int
    num_retracted: int
    # speculative decoding (0 when off): request-steps that verified proposals, tokens proposed, of those
    # the ones kept, and the tokens those steps emitted
    spec_runs: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_emitted_tokens: int = 0
    step_times: StepTimes = field(default_factory=StepTimes)
    # LoRA (--enable-lora): the adapters of running and of waiting requests, and --max-loras (0: LoRA off)
    running_loras: tuple[str, ...] = ()
    waiting_loras: tuple[str, ...] = ()
    max_loras: int = 0
    # sessions: tokens their pins hold (part of kv_used_tokens), sessions open and holding a pin, pins
    # released to make room (the pinned share or a running request needed it), sessions closed by timeout
    kv_pinned_tokens: int = 0
    open_sessions: int = 0
    pinned_sessions: int = 0
    sessions_released_for_memory: int = 0
    sessions_timed_out: int = 0
    # the second KV tier (--kv-tier-tokens; 0 when off): its size, tokens it holds, written to it, loaded back
    kv_tier_total_tokens: int = 0
    kv_tier_tokens: int = 0
    kv_tier_written_tokens: int = 0
    kv_tier_loaded_tokens: int = 0

    @property
    def kv_usage(self) -> float:
        return self.kv_used_tokens / max(1, self.kv_total_tokens)

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / max(1, self.prompt_tokens)

    @property
    def spec_acceptance_rate(self) -> float:
        """Proposed tokens kept / proposed tokens."""
        return self.spec_accepted_tokens / max(1, self.spec_draft_tokens)

    @property
    def spec_tokens_per_step(self) -> float:
        """Tokens a request emitted per step that verified proposals (1 would be no gain)."""
        return self.spec_emitted_tokens / max(1, self.spec_runs)
