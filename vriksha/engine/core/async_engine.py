"""The engine for servers: the step loop runs in a background thread beside the asyncio event loop.

Callers on the event loop submit requests and await cumulative outputs; the loop thread owns the engine, so
no engine state is touched from two threads. A consumer that stops iterating (a client disconnect cancels
it) aborts its request at once, and its KV memory returns to the pool before the next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from vriksha.engine.config import EngineConfig
from vriksha.engine.core.llm_engine import LLMEngine
from vriksha.engine.core.outputs import RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.engine.core.stats import EngineStats
from vriksha.errors import EngineFailedError, VrikshaError

logger = logging.getLogger(__name__)


class EngineDeadError(VrikshaError):
    """The engine loop is not running (not started, or shut down)."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine | None = None, **config_kwargs) -> None:
        self.engine = engine or LLMEngine(EngineConfig.from_flat(**config_kwargs))
        self.engine.step_threads.front_end = True  # the event loop of whoever awaits us shares the process
        logger.info("engine threads: %s", self.engine.step_threads.describe())
        self._commands: queue.Queue[tuple[Callable[[LLMEngine], Any], concurrent.futures.Future]] = (
            queue.Queue()
        )
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        # run in the loop thread after every step (profilers)
        self.step_hooks: list[Callable[[], None]] = self.engine.step_hooks
        self.failure: EngineFailedError | None = None  # the engine cannot go on (a tensor-parallel rank died)

    # ---- properties the server reads ---------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="vriksha-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Let running requests finish for up to `timeout_s`, then abort the rest and stop the loop."""
        if not self.running:
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.engine.has_unfinished and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self.engine.has_unfinished:
            await self.call(lambda e: e.abort_all())
            for rid in list(self._streams):
                self._push(rid, None)
        self._stop.set()
        self._wake.set()
        await asyncio.to_thread(self._thread.join, 10)

    # ---- requests ----------------------------------------------------------------------------------
    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run `fn(engine)` in the loop thread between steps and return its result."""
        if self.failure is not None:
            raise self.failure
        if not self.running:
            raise EngineDeadError("the engine loop is not running; call start() first")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put((fn, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    async def generate(
        self,
        prompt: str | list[int] | dict,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        lora: str | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request, one per engine step that advanced it; the last is finished.
        `lora`: the name of the LoRA adapter it runs with (None: the base model). `session_id`: the session
        it continues (its K/V stays pinned until the session's next turn, close or timeout)."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        spec = params.structured_outputs if params is not None else None
        if spec is not None:  # compiled and checked on a worker thread: a large one would stall every step
            await asyncio.to_thread(lambda: self.engine.grammar_engine().compile(spec))

        def add(engine: LLMEngine) -> str:
            rid = engine.add_request(
                prompt, params, request_id=request_id, stream=True, lora=lora, session_id=session_id
            )
            self._streams[rid] = (loop, outputs)
            return rid

        rid = await self.call(add)
        finished = False
        try:
            while True:
                item = await outputs.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished and self.running:
                self._commands.put((lambda e: e.abort(rid), concurrent.futures.Future()))
                self._wake.set()

    def abort(self, request_id: str) -> None:
        self._commands.put((lambda e: e.abort(request_id), concurrent.futures.Future()))
        self._wake.set()
        self._push(request_id, None)

    async def flush_cache(self) -> bool:
        return await self.call(lambda e: e.flush_cache())

    async def close_session(self, session_id: str) -> bool:
        """Close a session, releasing its pinned prefix; False when it is not open."""
        return await self.call(lambda e: e.close_session(session_id))

    # ---- the loop thread ---------------------------------------------------------------------------
    def _push(self, request_id: str, item: Any) -> None:
        target = self._streams.get(request_id)
        if target is not None:
            loop, outputs = target
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, item)
            except RuntimeError:  # the caller's event loop is closed
                self._streams.pop(request_id, None)

    def _run_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            if self.failure is not None:
                future.set_exception(self.failure)
                continue
            try:
                future.set_result(fn(self.engine))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(exc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            if not self.engine.has_unfinished:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except EngineFailedError as exc:
                logger.error("the engine failed: %s", exc)
                self.failure = exc
                for rid in self.engine.abort_all():
                    self._push(rid, exc)
                continue
            except Exception as exc:
                logger.exception("engine step failed; aborting the requests in flight")
                for rid in self.engine.abort_all():
                    self._push(rid, exc)
                continue
            for out in outputs:
                self._push(out.request_id, out)
        self._run_commands()
