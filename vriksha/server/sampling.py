"""Request bodies -> the engine's `SamplingParams`. A parameter the server cannot honour is refused by name."""

from __future__ import annotations

import logging
from typing import Any

from vriksha.engine.sampling_params import SamplingParams
from vriksha.engine.structured_outputs import StructuredOutputsParams
from vriksha.errors import InvalidRequestError
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

_EXTRAS = (
    "top_k",
    "min_p",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "repetition_penalty",
    "allowed_token_ids",
    "bad_words",
    "prompt_logprobs",
)
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def refuse(param: str, why: str) -> BadRequestError:
    return BadRequestError(f"{param} is not supported by this server: {why}", param=param)


def _structured(req: EngineExtras) -> StructuredOutputsParams | None:
    given: dict[str, Any] = {}
    if req.structured_outputs is not None:
        given.update(req.structured_outputs.model_dump(exclude_none=True, by_alias=True))
    for field, kind in _GUIDED.items():
        value = getattr(req, field)
        if value is not None:
            given[kind] = value
    if not given:
        return None
    try:
        return check_structured(StructuredOutputsParams(**given), "structured_outputs")
    except InvalidRequestError as e:
        raise BadRequestError(str(e), param="structured_outputs") from None


def logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    if not raw:
        return None
    out: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise BadRequestError(
                f"logit_bias keys must be token ids (integers as strings), got {key!r}", param="logit_bias"
            ) from None
        out[token] = float(value)
    return out


def _extras(req: EngineExtras) -> dict[str, Any]:
    if req.return_hidden_states:
        raise BadRequestError(
            "return_hidden_states=true is not supported; omit it or pass false", param="return_hidden_states"
        )
    out: dict[str, Any] = {}
    if req.no_stop_trim:
        out["include_stop_str_in_output"] = True
    for name in _EXTRAS:
        value = getattr(req, name)
        if value is not None:
            out[name] = value
    so = _structured(req)
    if so is not None:
        out["structured_outputs"] = so
    return out


def _penalties(req: OpenAISampling | NativeSamplingParams, out: dict[str, Any]) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None:
            out[name] = float(value)
    bias = logit_bias(req.logit_bias)
    if bias:
        out["logit_bias"] = bias


def _openai_common(req: OpenAISampling) -> dict[str, Any]:
    out = _extras(req)
    _penalties(req, out)
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


def check_structured(spec: StructuredOutputsParams, param: str) -> StructuredOutputsParams:
    """An invalid or unsatisfiable schema/grammar: a 400 naming `param`, before the request reaches the engine."""
    from vriksha.engine.grammar import check_grammar

    try:
        check_grammar(spec)
    except InvalidRequestError as e:
        raise BadRequestError(str(e), param=param) from None
    return spec


def check_prompt_logprobs(params: SamplingParams, prompt_lens: list[int], copies: int, limit: int) -> None:
    """400 when the prompt log-probabilities a request asks for (prompt tokens x (k + 1), `copies` times: a
    completions choice carries its prompt's) pass `limit`: they are kept for the whole request, and returned."""
    k = params.prompt_logprobs
    if k is None:
        return
    scored = sum(max(0, n - 1) for n in prompt_lens)
    entries = scored * (k + 1) * copies
    if entries > limit:
        times = f", in each of n={copies} choices" if copies > 1 else ""
        raise BadRequestError(
            f"prompt_logprobs={k} over {scored} prompt tokens{times} asks for {entries} log-probabilities; this "
            f"server returns at most {limit} per request (--max-prompt-logprobs); shorten the prompts, send "
            "fewer per request, or ask for fewer alternatives",
            param="prompt_logprobs",
        )


def build(kw: dict[str, Any]) -> SamplingParams:
    """SamplingParams(**kw); its validation errors become 400s naming the field."""
    try:
        return SamplingParams(**kw)
    except InvalidRequestError as e:
        field = next((k for k in kw if k in str(e)), None)
        raise BadRequestError(str(e), param=field) from None


def echo_only(req: CompletionRequest) -> bool:
    """`echo` with `max_tokens: 0`: the prompt back (with its log-probs), nothing generated (OpenAI's legacy
    prompt-scoring request, which vLLM accepts too)."""
    return bool(req.echo) and req.max_tokens == 0


def completion_params(req: CompletionRequest) -> SamplingParams:
    if req.max_tokens == 0 and not req.echo:
        raise BadRequestError(
            "max_tokens=0 generates nothing; it is for scoring the prompt with echo=true (and logprobs): "
            "send echo=true or max_tokens >= 1",
            param="max_tokens",
        )
    if not echo_only(req):
        _check_positive(req.max_tokens, "max_tokens")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise BadRequestError(
            f"best_of={req.best_of} is not supported; omit it or set it equal to n", param="best_of"
        )
    if req.suffix:
        raise refuse("suffix", "insertion (fill-in-the-middle) is not implemented; omit suffix")
    kw = _openai_common(req)
    kw["max_tokens"] = req.max_tokens if req.max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS
    if echo_only(req):  # the engine's one token (the prompt's last forward gives it) is not returned
        kw["max_tokens"] = 1
    if req.logprobs is not None:
        kw["logprobs"] = req.logprobs
        if req.echo:  # the prompt's tokens are scored too
            kw["prompt_logprobs"] = max(req.logprobs, kw.get("prompt_logprobs") or 0)
    return build(kw)


_CHAT_REFUSED = {
    "audio": "audio output is not implemented",
    "prediction": "predicted outputs are not implemented",
    "web_search_options": "there is no web search",
    "functions": "the deprecated functions API is not implemented; send tools instead",
    "function_call": "the deprecated functions API is not implemented; send tool_choice instead",
    "moderation": "there is no moderation",
}


def check_chat_support(req: ChatCompletionRequest) -> None:
    """Refuse, by name, the chat parameters this server cannot honour."""
    for name, why in _CHAT_REFUSED.items():
        if getattr(req, name) is not None:
            raise refuse(name, why)
    if req.modalities is not None and list(req.modalities) != ["text"]:
        raise refuse("modalities", "this server outputs text only; omit modalities or send ['text']")
    if req.store:
        raise refuse("store", "completions are not stored; omit store or send false")
    if req.reasoning_effort is not None:
        raise refuse("reasoning_effort", "the model has no reasoning mode; omit reasoning_effort")
    if req.verbosity not in (None, "medium"):
        raise refuse("verbosity", "output verbosity cannot be steered; omit verbosity")
    if req.service_tier not in (None, "auto", "default"):
        raise refuse("service_tier", "there is one service tier; omit it or send 'auto'")


def response_format(req: ChatCompletionRequest) -> StructuredOutputsParams | None:
    """OpenAI's response_format: text, json_object or json_schema (strict or not, always enforced)."""
    rf = req.response_format
    if rf is None:
        return None
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return check_structured(StructuredOutputsParams(json_object=True), "response_format")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequestError(
                "response_format.json_schema.schema must be a JSON Schema object", param="response_format"
            )
        return check_structured(StructuredOutputsParams(json=schema), "response_format")
    raise BadRequestError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format",
    )


def chat_params(req: ChatCompletionRequest, prompt_len: int, max_model_len: int) -> SamplingParams:
    check_chat_support(req)
    _check_positive(req.max_completion_tokens, "max_completion_tokens")
    _check_positive(req.max_tokens, "max_tokens")
    if req.top_logprobs is not None and not req.logprobs:
        raise BadRequestError(
            "top_logprobs needs logprobs=true; set logprobs to true or drop top_logprobs",
            param="top_logprobs",
        )
    kw = _openai_common(req)
    rf = response_format(req)
    if rf is not None:
        if "structured_outputs" in kw:
            raise BadRequestError(
                "send either response_format or structured_outputs, not both", param="response_format"
            )
        kw["structured_outputs"] = rf
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    # default: whatever the context leaves (the engine rejects the request when nothing is left)
    kw["max_tokens"] = max_tokens if max_tokens is not None else max(1, max_model_len - prompt_len)
    if req.logprobs:
        kw["logprobs"] = req.top_logprobs or 0
    return build(kw)


def native_params(sp: NativeSamplingParams) -> SamplingParams:
    kw = _extras(sp)
    _penalties(sp, kw)
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
    return build(kw)
