"""What the engine returns: vLLM-shaped request and completion outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    """One sampled sequence of a request (a request with `n > 1` has `n` of these)."""

    index: int
    text: str
    token_ids: list[int]
    # log-probability of each sampled token under the engine's (temperature-free) distribution
    token_logprobs: list[float]
    # per step, {token_id: logprob} for the sampled token plus the top-k alternatives; None unless asked
    logprobs: list[dict[int, float]] | None
    # "stop" (eos, stop string or stop token), "length", "abort", "error" (see `error`), or None while running
    finish_reason: str | None
    stop_reason: int | str | None = None
    error: str | None = None  # what went wrong, when finish_reason is "error" (the text is then not usable)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    # prompt tokens whose KV came from the prefix cache instead of being computed
    num_cached_tokens: int = 0
    # per prompt position, {token_id: logprob} for the prompt token plus the top-k; None at position 0
    prompt_logprobs: list[dict[int, float] | None] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # the weight version the request was computed under (0: the weights loaded at start)
    weight_version: int = 0
