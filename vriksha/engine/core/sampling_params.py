"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.errors import InvalidRequestError


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request. Field names follow vLLM's `SamplingParams`.

    `temperature == 0` means greedy. `logprobs=k` returns the sampled token's log-probability
    plus the top-`k` alternatives at each step (`logprobs=0`: the sampled token's only); the
    sampled token's log-probability is always recorded in `CompletionOutput.token_logprobs`.

    Penalties follow OpenAI and vLLM: `presence_penalty` and `frequency_penalty` (in [-2, 2]) subtract
    from the logits of tokens already generated, once and per occurrence; `repetition_penalty` (> 0, 1 is
    off) divides positive and multiplies negative logits of tokens in the prompt or the output;
    `logit_bias` adds to chosen tokens' logits (in [-100, 100]). `allowed_token_ids` keeps only those
    tokens, `bad_words` never completes one of those words. `prompt_logprobs=k` returns each prompt
    token's log-probability (plus top-k). `structured_outputs` constrains the text by a grammar. Returned
    log-probabilities are the model's, before penalties, bias and constraints.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.validate()

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        def bad(field_name: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"invalid sampling parameter {field_name}: {why}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be an integer >= 1, got {self.n!r}")
        if self.temperature < 0:
            raise bad("temperature", f"must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise bad("top_k", f"must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", f"must be in [0, 20], got {self.logprobs}")
        if any(not s for s in self.stop):
            raise bad("stop", "stop strings must be non-empty")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise bad(name, f"must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise bad("repetition_penalty", f"must be > 0 (1 disables it), got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
                raise bad("logit_bias", f"bias of token {token} must be in [-100, 100], got {bias}")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise bad("allowed_token_ids", "must not be empty (omit it to allow every token)")
        if any(not w for w in self.bad_words or []):
            raise bad("bad_words", "words must be non-empty")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise bad("prompt_logprobs", f"must be in [0, 20], got {self.prompt_logprobs}")

    def token_ids_used(self) -> list[int]:
        """Every token id the parameters name (checked against the vocabulary by the engine)."""
        return list(self.logit_bias or {}) + list(self.allowed_token_ids or []) + list(self.stop_token_ids)
