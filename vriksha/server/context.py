"""The one check of a request against the model's context, for every endpoint: the prompt plus `max_tokens`
must fit `max_model_len`, or the request gets 400 `context_length_exceeded` (never a silent clip).

A prompt text far longer than the context is refused without tokenizing it: no token covers more characters
than the longest in the vocabulary, so a text of C characters (after the tokenizer's normalizer) has at least
C / longest tokens. Tokenizing a 6 MB prompt only to refuse it takes tens of seconds of CPU."""

from __future__ import annotations

from typing import Any

from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.server.errors import BadRequestError

EnginePrompt = list[int] | dict[str, Any]  # token ids, or {"prompt": text, "prompt_token_ids": ids}


class ContextLengthError(BadRequestError, code="context_length_exceeded"):
    """The prompt plus the tokens asked for do not fit the model's context."""


class PromptEncoder:
    """Prompt text -> token ids as the engine counts them (without special tokens), a text too long for the
    context whatever its tokens refused before tokenizing."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._longest: int | None = None

    @property
    def longest_token_chars(self) -> int:
        if self._longest is None:
            self._longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1
        return self._longest

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens of `text`."""
        normalizer = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "normalizer", None)
        chars = len(normalizer.normalize_str(text)) if normalizer is not None else len(text)
        return -(-chars // self.longest_token_chars)

    def encode(self, text: str) -> list[int]:
        # (the first test spares short prompts the vocabulary scan)
        if len(text) >= self.max_model_len and len(text) >= self.max_model_len * self.longest_token_chars:
            fewest = self.fewest_tokens(text)
            if fewest >= self.max_model_len:
                raise ContextLengthError(
                    f"this model's maximum context length is {self.max_model_len} tokens, and the prompt alone "
                    f"has at least {fewest} ({len(text)} characters); shorten the prompt",
                    param="prompt",
                )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def engine_prompt(self, prompt: str | list[int]) -> EnginePrompt:
        """The prompt as the engine takes it: its token ids, with its text where it has one (for echo)."""
        if isinstance(prompt, str):
            return {"prompt": prompt, "prompt_token_ids": self.encode(prompt)}
        return list(prompt)


def prompt_length(tokenizer: Any, prompt: str | EnginePrompt) -> int:
    """Tokens of a prompt as the engine counts them (text is encoded without special tokens, as it does)."""
    if isinstance(prompt, dict):
        return len(prompt["prompt_token_ids"])
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
