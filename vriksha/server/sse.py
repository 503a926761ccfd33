"""Server-sent events and client-disconnect handling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from vriksha.profiling import phase
from vriksha.server.drain import Drain
from vriksha.server.errors import ClientDisconnected, ServerError, error_body

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(obj: dict[str, Any]) -> bytes:
    with phase("server.stream_write"):
        return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def error_event(message: str, type_: str = "server_error", code: str | None = None) -> bytes:
    return event(error_body(message, type_, code))


def server_error_event(exc: ServerError) -> bytes:
    return error_event(str(exc), exc.type, exc.code)


class SSEResponse(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends: finished, failed, or cancelled because
    the client disconnected (Starlette cancels the body then, perhaps before it ever started)."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._body = body
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                await asyncio.shield(aclose())
            await asyncio.shield(self._on_close())


def sse_response(
    body: AsyncIterator[bytes], streams: Sequence[Any], drain: Drain | None = None
) -> SSEResponse:
    async def close() -> None:
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)

    return SSEResponse(body if drain is None else until_drained(body, drain), close)


async def until_drained(body: AsyncIterator[bytes], drain: Drain) -> AsyncIterator[bytes]:
    """`body`'s events until the drain deadline; then (the rest cut) an error event and `[DONE]`."""
    expired = asyncio.ensure_future(drain.expired.wait())
    step: asyncio.Future[bytes] | None = None
    try:
        while True:
            step = asyncio.ensure_future(body.__anext__())
            await asyncio.wait({step, expired}, return_when=asyncio.FIRST_COMPLETED)
            if step.done():
                try:
                    chunk = step.result()
                except StopAsyncIteration:
                    return
                yield chunk
                continue
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
            yield server_error_event(drain.error())
            yield DONE
            return
    finally:  # also when the client disconnects: the pending step is cancelled inside `body`, which aborts
        for task in (expired, step):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (expired, step) if t is not None), return_exceptions=True)
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            await asyncio.gather(aclose(), return_exceptions=True)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T], drain: Drain | None = None) -> T:
    """Await `work`, cancelling it (and so aborting its engine requests) as soon as the client disconnects, or
    the drain deadline passes (then a 503 `ShuttingDownError`)."""
    task = asyncio.ensure_future(work)
    watchers = [asyncio.ensure_future(_wait_disconnect(request))]
    if drain is not None:
        watchers.append(asyncio.ensure_future(drain.expired.wait()))
    try:
        done, _ = await asyncio.wait({task, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        for t in (task, *watchers):
            t.cancel()
        await asyncio.gather(task, *watchers, return_exceptions=True)
        raise
    for w in watchers:
        w.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    if drain is not None and drain.expired.is_set():
        raise drain.error()
    raise ClientDisconnected("client disconnected; request aborted")
