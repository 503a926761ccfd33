"""One engine request as the server sees it: admission, metrics, and abort when its consumer goes away."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from vriksha.engine.core.outputs import RequestOutput
from vriksha.engine.core.protocol import EngineProtocol
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.server.admission import Admission
from vriksha.server.context import EnginePrompt, check_context, prompt_length
from vriksha.server.errors import StructuredOutputFailedError
from vriksha.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class EngineClient:
    def __init__(self, engine: EngineProtocol, metrics: ServerMetrics, admission: Admission) -> None:
        self.engine = engine
        self.metrics = metrics
        self.admission = admission

    def open(
        self,
        prompt: str | EnginePrompt,
        params: SamplingParams,
        endpoint: str,
        request_id: str | None = None,
        lora: str | None = None,
        session_id: str | None = None,
    ) -> RequestStream:
        """Check the request against the context (400 when prompt + max_tokens do not fit), admit its `n`
        sequences (503 when the waiting queue is full) and return its not-yet-started stream. Give the prompt
        tokenized (`PromptEncoder.engine_prompt`, off the event loop): text is tokenized here."""
        check_context(prompt_length(self.engine.tokenizer, prompt), params, int(self.engine.max_model_len))
        self.admission.admit(params.n)
        return RequestStream(self, prompt, params, endpoint, request_id or uuid.uuid4().hex, lora, session_id)

    async def open_all(
        self,
        prompts: Sequence[str | EnginePrompt],
        params: SamplingParams,
        endpoint: str,
        request_ids: Sequence[str | None] | None = None,
        lora: str | None = None,
        session_id: str | None = None,
    ) -> list[RequestStream]:
        """`open` for each prompt; when one is refused, the ones opened before it are closed."""
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(
                    self.open(
                        prompt,
                        params,
                        endpoint,
                        None if request_ids is None else request_ids[i],
                        lora,
                        session_id,
                    )
                )
        except BaseException:
            for s in streams:
                await s.aclose()
            raise
        return streams

    async def abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:  # aborting an already finished request is not an error
            logger.debug("abort of %s failed", request_id, exc_info=True)


class RequestStream:
    """Cumulative `RequestOutput`s of one request. `await start()` waits for the first output, so that errors the
    engine raises (prompt too long, bad parameters) surface before a response has begun. Closing the stream
    early, or cancelling the task that reads it, aborts the request in the engine."""

    def __init__(
        self,
        client: EngineClient,
        prompt: str | EnginePrompt,
        params: SamplingParams,
        endpoint: str,
        request_id: str,
        lora: str | None = None,
        session_id: str | None = None,
    ) -> None:
        self.client = client
        self.lora = lora  # the LoRA adapter's name; None: the base model
        self.session_id = session_id  # the session it continues; None: none
        self.request_id = request_id
        self.params = params
        self.endpoint = endpoint
        self._gen = self._run(prompt)
        self._first: RequestOutput | None = None
        self._entered = False
        self.last: RequestOutput | None = None

    async def _run(self, prompt: str | EnginePrompt) -> AsyncIterator[RequestOutput]:
        self._entered = True
        client, m = self.client, self.client.metrics
        t0 = time.perf_counter()
        t_first: float | None = None
        finished = False
        failed = False
        running = False  # the engine still runs sequences of this request
        started = 0  # sequences with a first token: they no longer count as waiting
        adapter: dict[str, str] = (
            {"lora": self.lora} if self.lora is not None else {}
        )  # engines without LoRA take no `lora`
        if self.session_id is not None:
            adapter["session_id"] = self.session_id
        agen = client.engine.generate(prompt, self.params, request_id=self.request_id, **adapter)
        try:
            async for out in agen:
                running = True
                if t_first is None:
                    t_first = time.perf_counter()
                    m.ttft.observe(t_first - t0)
                now_started = sum(1 for c in out.outputs if c.token_ids or c.finish_reason is not None)
                if now_started > started:
                    client.admission.started(now_started - started)
                    started = now_started
                self.last = out
                broken = next((c for c in out.outputs if c.finish_reason == "error"), None)
                if broken is not None:
                    raise StructuredOutputFailedError(broken.error or "the output failed during generation")
                if out.finished:
                    finished = True
                    self._record(out, t0, t_first)
                yield out
                if finished:
                    return
        except Exception:
            failed = True
            raise
        finally:
            client.admission.started(self.params.n - started)
            client.admission.done()
            if not finished:
                m.requests.labels(self.endpoint, "error" if failed else "abort").inc()
                # a request that failed before its first output is gone (or was never added: its id may
                # belong to another); one that failed after it may still run sequences
                if not failed or running:
                    await client.abort(self.request_id)
            await _aclose(agen)

    def _record(self, out: RequestOutput, t0: float, t_first: float) -> None:
        m = self.client.metrics
        now = time.perf_counter()
        m.e2e.observe(now - t0)
        longest = max((len(c.token_ids) for c in out.outputs), default=0)
        if longest > 1:
            m.tpot.observe((now - t_first) / (longest - 1))
        m.prompt_tokens.inc(len(out.prompt_token_ids))
        m.cached_tokens.inc(out.num_cached_tokens)
        m.generation_tokens.inc(sum(len(c.token_ids) for c in out.outputs))
        for c in out.outputs:
            m.requests.labels(self.endpoint, c.finish_reason or "unknown").inc()

    async def start(self) -> RequestOutput:
        if self._first is None:
            try:
                self._first = await self._gen.__anext__()
            except StopAsyncIteration as exc:
                raise RuntimeError("the engine finished a request without any output") from exc
        return self._first

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            yield await self.start()
            async for out in self._gen:
                yield out
        finally:
            await self.aclose()

    async def final(self) -> RequestOutput:
        last = None
        async for out in self:
            last = out
        assert last is not None
        return last

    async def aclose(self) -> None:
        if not self._entered:  # never started: only the admission needs releasing
            self._entered = True
            self.client.admission.started(self.params.n)
            self.client.admission.done()
        await _aclose(self._gen)


async def _aclose(agen: Any) -> None:
    close = getattr(agen, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except (RuntimeError, StopAsyncIteration):  # already running/closed
        pass


async def start_all(streams: list[RequestStream]) -> None:
    """Start every stream (first outputs) concurrently; on any error close them all and re-raise it."""
    try:
        await asyncio.gather(*(s.start() for s in streams))
    except BaseException:
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
        raise


async def merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several streams as (stream index, output), in arrival order; closes all of them on exit."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for out in s:
                await queue.put((i, out))
            await queue.put((i, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(streams)
    try:
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
