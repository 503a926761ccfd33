"""Everything a route needs, built once per app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from vriksha.engine.core.protocol import EngineProtocol
from vriksha.server.admission import Admission
from vriksha.server.config import ServerConfig
from vriksha.server.context import PromptEncoder
from vriksha.server.drain import Drain
from vriksha.server.engine_client import EngineClient
from vriksha.server.logprobs import TokenText
from vriksha.server.metrics import ServerMetrics
from vriksha.server.profiler import ServerProfiler


@dataclass(slots=True)
class ServerState:
    engine: EngineProtocol
    config: ServerConfig
    admission: Admission
    metrics: ServerMetrics
    client: EngineClient
    profiler: ServerProfiler
    drain: Drain
    _text_of: TokenText | None = None
    _tool_parser: str | None = None
    _encoder: PromptEncoder | None = None
    _reasoning: Any = None  # the ReasoningParser, built on first use
    _responses: Any = None  # the ResponseStore of /v1/responses, built on first use

    @property
    def model_names(self) -> list[str]:
        return self.config.served_model_names or [self.engine.model_name]

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def text_of(self) -> TokenText:
        if self._text_of is None:
            self._text_of = TokenText(self.tokenizer)
        return self._text_of

    @property
    def encoder(self) -> PromptEncoder:
        if self._encoder is None:
            self._encoder = PromptEncoder(self.tokenizer, self.max_model_len)
        return self._encoder

    @property
    def tool_parser_name(self) -> str:
        """The tool-call convention: the --tool-call-parser flag, else the one the chat template writes."""
        if self._tool_parser is None:
            from vriksha.toolcalls import parser_for_template

            template = getattr(self.tokenizer, "chat_template", None)
            self._tool_parser = parser_for_template(
                template if isinstance(template, str) else None, self.config.tool_call_parser
            )
        return self._tool_parser

    @property
    def reasoning_parser(self) -> Any:
        """The --reasoning-parser's `ReasoningParser`, or None (the reply comes back whole)."""
        name = self.config.reasoning_parser
        if name is None:
            return None
        if self._reasoning is None:
            from vriksha.reasoning import get_reasoning_parser

            self._reasoning = get_reasoning_parser(name)
        return self._reasoning

    @property
    def responses(self) -> Any:
        """The stored /v1/responses (`ResponseStore`), for previous_response_id and GET."""
        if self._responses is None:
            from vriksha.server.response_store import ResponseStore

            self._responses = ResponseStore(self.config.responses_max_stored, self.config.responses_ttl_s)
        return self._responses

    def check_model(self, name: str) -> str:
        """`name` when it is a served model name or a loaded LoRA adapter's; else 404 naming it."""
        if name not in self.model_names:
            from vriksha.server.routes_lora import lora_of

            lora_of(self, name)
        return name

    def lora_of(self, name: str) -> str | None:
        """The LoRA adapter a request's `model` selects (None: the base model); 404 for an unknown name."""
        from vriksha.server.routes_lora import lora_of

        return lora_of(self, name)


def get_state(request: Request) -> ServerState:
    return request.app.state.vriksha


StateDep = Annotated[ServerState, Depends(get_state)]
