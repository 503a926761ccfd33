"""The one check of a request against the model's context, for every endpoint: the prompt plus `max_tokens`
must fit `max_model_len`, or the request gets 400 `context_length_exceeded` (never a silent clip)."""

from __future__ import annotations

from typing import Any

from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.server.errors import BadRequestError


class ContextLengthError(BadRequestError, code="context_length_exceeded"):
    """The prompt plus the tokens asked for do not fit the model's context."""


def prompt_length(tokenizer: Any, prompt: str | list[int]) -> int:
    """Tokens of a prompt as the engine counts them (text is encoded without special tokens, as it does)."""
    if isinstance(prompt, str):
        return len(tokenizer.encode(prompt, add_special_tokens=False))
    return len(prompt)


def check_context(prompt_len: int, params: SamplingParams, max_model_len: int) -> None:
    if prompt_len >= max_model_len:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens, and the prompt alone has "
            f"{prompt_len}; shorten the prompt",
            param="prompt",
        )
    if prompt_len + params.max_tokens > max_model_len:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len} and "
            f"max_tokens asks for {params.max_tokens} more ({prompt_len + params.max_tokens} in all); lower "
            f"max_tokens to at most {max_model_len - prompt_len} or shorten the prompt",
            param="max_tokens",
        )
