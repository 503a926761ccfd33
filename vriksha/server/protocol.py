"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

Every parameter OpenAI defines is declared, so a field OpenAI accepts is parsed here too; one the server
cannot honour is refused with a 400 naming it (`server/sampling.py`, the table in docs/server.md); any other
field is rejected with 400, as OpenAI does.
A few vLLM-style extensions (`top_k`, `min_p`, `ignore_eos`, ...) are declared as well, for clients that
send them through `extra_body`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vriksha.net.fields import FiniteFloat, Int32, Seed, TokenId, WireModel

MAX_N = 128  # OpenAI's bound on choices per request, on every endpoint

N = Annotated[int, Field(ge=1, le=MAX_N)]


class Strict(WireModel):
    """Unknown fields refused, no coercion, every string valid Unicode, numbers finite and in range."""


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    # vLLM's extension (guidellm always sends it): with include_usage, the usage so far in every chunk
    continuous_usage_stats: bool | None = None

    @property
    def continuous(self) -> bool:
        return bool(self.include_usage and self.continuous_usage_stats)


class StructuredOutputsRequest(Strict):
    """vLLM's `structured_outputs` extra: exactly one of these (`json` on the wire; a pydantic model has a
    `json` method, so the field is named `json_spec` here)."""

    model_config = ConfigDict(populate_by_name=True)

    json_spec: str | dict[str, Any] | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class EngineExtras(Strict):
    """Sampling extensions beyond OpenAI's, named as in vLLM's server."""

    top_k: Int32 | None = None
    min_p: FiniteFloat | None = None
    min_tokens: Int32 | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    repetition_penalty: FiniteFloat | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: Int32 | None = None
    # structured outputs, vLLM's names: one object, or the older guided_* fields
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # fields SGLang-style routers (vllm-router) add to every request, see docs/router.md
    no_stop_trim: bool | None = None  # true: keep the matched stop string (= include_stop_str_in_output)
    return_hidden_states: bool | None = None  # only false is supported


class RouterChatExtras(Strict):
    """Chat fields vllm-router adds. `continue_final_message` is honoured; the reasoning switches have no
    effect: the reasoning is split out by `--reasoning-parser` (then always), else comes back whole in `content`."""

    continue_final_message: bool | None = None
    separate_reasoning: bool | None = None
    stream_reasoning: bool | None = None
    include_reasoning: bool | None = None


class OpenAISampling(EngineExtras):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    frequency_penalty: FiniteFloat | None = None
    presence_penalty: FiniteFloat | None = None
    logit_bias: dict[str, FiniteFloat] | None = None
    max_tokens: Int32 | None = None
    n: N | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    user: str | None = None
    # vriksha: the session (an agent's episode) this request continues; its K/V stays pinned between turns
    session_id: str | None = Field(None, min_length=1, max_length=256)


class CompletionRequest(OpenAISampling):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    best_of: Int32 | None = None
    echo: bool | None = False
    logprobs: Int32 | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    """One message; fields beyond role/content (tool calls, names, ...) are passed to the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["developer", "system", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(OpenAISampling, RouterChatExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    audio: dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    logprobs: bool | None = False
    top_logprobs: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    moderation: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    # chat-template extensions (vLLM names)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class NativeSamplingParams(EngineExtras):
    """`sampling_params` of the native /generate: the engine's `SamplingParams` fields."""

    n: N = 1
    temperature: FiniteFloat = 1.0
    top_p: FiniteFloat = 1.0
    seed: Seed | None = None
    max_tokens: Int32 | None = None
    max_new_tokens: Int32 | None = None  # SGLang's name for max_tokens
    stop: str | list[str] | None = None
    logprobs: Int32 | None = None
    presence_penalty: FiniteFloat | None = None
    frequency_penalty: FiniteFloat | None = None
    logit_bias: dict[str, FiniteFloat] | None = None


class GenerateRequest(Strict):
    """Native generation on token ids: no chat template, no retokenisation."""

    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    text: str | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False
    request_id: str | None = None
    return_text: bool = True
    session_id: str | None = Field(None, min_length=1, max_length=256)


class CloseSessionRequest(Strict):
    session_id: str = Field(min_length=1, max_length=256)


class ProfileRequest(Strict):
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
