"""Request bodies -> the engine's `SamplingParams`."""

from __future__ import annotations

import logging
from typing import Any

from vriksha.engine.sampling_params import SamplingParams
from vriksha.server.errors import BadRequestError
from vriksha.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EngineExtras,
    NativeSamplingParams,
    OpenAISampling,
)

logger = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _extras(req: EngineExtras) -> dict[str, Any]:
    if req.repetition_penalty not in (None, 1.0):
        raise BadRequestError(
            f"repetition_penalty={req.repetition_penalty} is not supported; omit it or pass 1.0",
            param="repetition_penalty",
        )
    if req.return_hidden_states:
        raise BadRequestError(
            "return_hidden_states=true is not supported; omit it or pass false", param="return_hidden_states"
        )
    out: dict[str, Any] = {}
    if req.no_stop_trim:
        out["include_stop_str_in_output"] = True
    for name in (
        "top_k",
        "min_p",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "skip_special_tokens",
        "include_stop_str_in_output",
    ):
        value = getattr(req, name)
        if value is not None:
            out[name] = value
    return out


def _openai_common(req: OpenAISampling) -> dict[str, Any]:
    ignored = [
        name for name in ("frequency_penalty", "presence_penalty") if getattr(req, name) not in (None, 0, 0.0)
    ] + (["logit_bias"] if req.logit_bias else [])
    if ignored:
        logger.debug("ignoring unimplemented parameters %s", ignored)
    out = _extras(req)
    if req.n is not None:
        out["n"] = req.n
    if req.temperature is not None:
        out["temperature"] = float(req.temperature)
    if req.top_p is not None:
        out["top_p"] = float(req.top_p)
    if req.seed is not None:
        out["seed"] = req.seed
    if req.stop is not None:
        out["stop"] = req.stop
    return out


def _check_positive(value: int | None, name: str) -> None:
    if value is not None and value < 1:
        raise BadRequestError(f"invalid value for {name}: must be an integer >= 1, got {value}", param=name)


def completion_params(req: CompletionRequest) -> SamplingParams:
    _check_positive(req.max_tokens, "max_tokens")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise BadRequestError(
            f"best_of={req.best_of} is not supported; omit it or set it equal to n", param="best_of"
        )
    if req.echo and req.logprobs is not None:
        raise BadRequestError(
            "echo with logprobs needs prompt log-probabilities, which are not supported; drop one of them",
            param="echo",
        )
    kw = _openai_common(req)
    kw["max_tokens"] = req.max_tokens if req.max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS
    if req.logprobs is not None:
        kw["logprobs"] = req.logprobs
    return SamplingParams(**kw)


def chat_params(req: ChatCompletionRequest, prompt_len: int, max_model_len: int) -> SamplingParams:
    _check_positive(req.max_completion_tokens, "max_completion_tokens")
    _check_positive(req.max_tokens, "max_tokens")
    if req.top_logprobs is not None and not req.logprobs:
        raise BadRequestError(
            "top_logprobs needs logprobs=true; set logprobs to true or drop top_logprobs",
            param="top_logprobs",
        )
    kw = _openai_common(req)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    # default: whatever the context leaves (the engine rejects the request when nothing is left)
    kw["max_tokens"] = max_tokens if max_tokens is not None else max(1, max_model_len - prompt_len)
    if req.logprobs:
        kw["logprobs"] = req.top_logprobs or 0
    return SamplingParams(**kw)


def native_params(sp: NativeSamplingParams) -> SamplingParams:
    kw = _extras(sp)
    max_tokens = sp.max_tokens if sp.max_tokens is not None else sp.max_new_tokens
    _check_positive(max_tokens, "max_tokens")
    kw.update(
        n=sp.n,
        temperature=float(sp.temperature),
        top_p=float(sp.top_p),
        seed=sp.seed,
        stop=sp.stop,
        logprobs=sp.logprobs,
    )
    if max_tokens is not None:
        kw["max_tokens"] = max_tokens
    return SamplingParams(**kw)
