"""What the engine reports of itself: running and waiting requests, KV use, token counts, speculation."""

from __future__ import annotations

from dataclasses import dataclass


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
