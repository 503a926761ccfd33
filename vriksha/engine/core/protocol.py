"""What a server needs of an engine: `AsyncEngine` provides it; a test double or a remote engine may too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from vriksha.engine.core.outputs import RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.engine.core.stats import EngineStats
from vriksha.engine.core.validation import Prompt


@runtime_checkable
class EngineProtocol(Protocol):
    step_hooks: list[Callable[[], None]]  # run after every engine step (profilers)

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_model_len(self) -> int: ...

    def stats(self) -> EngineStats: ...

    async def start(self) -> None: ...

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Let running requests finish for up to `timeout_s`, then abort the rest and stop."""

    def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request; the last is finished. Raises the engine's validation errors
        (`InvalidRequestError`, `PromptTooLongError`) before the first output. An engine serving LoRA
        adapters also takes `lora=NAME` (the server passes it only for a request that names an adapter); one
        with sessions takes `session_id=ID` and has `async close_session(ID) -> bool` (the server passes and
        calls them only for a request that names a session)."""

    def abort(self, request_id: str) -> None:
        """Stop a request (unknown or finished ids are ignored); its stream ends."""

    async def flush_cache(self) -> bool:
        """Drop the prefix cache; False when running requests still hold part of it."""
