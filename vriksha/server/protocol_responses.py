"""The request body of POST /v1/responses (OpenAI's Responses API), as a pydantic model.

Every field OpenAI defines is declared; one the server cannot honour is refused with a 400 naming it
(`server/responses_items.py`); any other field is rejected with 400, as OpenAI does.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vriksha.net.fields import FiniteFloat, Int32
from vriksha.server.protocol import EngineExtras


class ResponsesRequest(EngineExtras):
    model: str
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    max_output_tokens: Int32 | None = None
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    seed: Int32 | None = None  # vLLM's extension
    # declared so that they are refused by name rather than as unknown fields
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    max_tool_calls: Int32 | None = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    top_logprobs: Int32 | None = None
