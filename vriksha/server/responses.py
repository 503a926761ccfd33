"""Response bodies of the OpenAI-compatible and native endpoints, as pydantic models."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, field_serializer, model_serializer


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class _Envelope(BaseModel):
    """What every completion body and chunk carries besides its object type and choices."""

    id: str
    created: int = Field(default_factory=now)
    model: str
    usage: Usage | None = None
    system_fingerprint: str | None = None


# --- /v1/completions ---


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # vLLM's extra


class CompletionResponse(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


# --- /v1/chat/completions ---


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None  # with --reasoning-parser (vLLM's field); left out when None

    @model_serializer(mode="wrap")
    def _without_absent_reasoning(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("reasoning_content") is None:
            out.pop("reasoning_content", None)
        return out


class _ChatChoiceBase(BaseModel):
    index: int
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatChoice(_ChatChoiceBase):
    message: AssistantMessage


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # vLLM's extra


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(_ChatChoiceBase):
    delta: Delta

    @field_serializer("delta")
    def _delta(self, delta: Delta) -> dict[str, Any]:
        return delta.model_dump(exclude_none=True)  # {"content": "..."}, or {} when a chunk only finishes


class ChatCompletionChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


# --- /v1/models ---


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "vriksha"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- native /generate ---


class GenerateOutput(BaseModel):
    index: int
    token_ids: list[int]
    token_logprobs: list[float]
    # per step: [[token_id, logprob], ...] for the top alternatives, best first; None unless asked
    top_logprobs: list[list[tuple[int, float]]] | None = None
    text: str | None = None
    finish_reason: str | None = None


class GenerateResponse(BaseModel):
    request_id: str
    prompt_tokens: int
    cached_tokens: int
    outputs: list[GenerateOutput]
    finished: bool = True
    meta: dict[str, Any] = Field(default_factory=dict)
    weight_version: int = 0  # the weights the request was computed under (see /weight_version)
