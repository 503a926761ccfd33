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
from vriksha.server.errors import ClientDisconnected, error_body

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(obj: dict[str, Any]) -> bytes:
    with phase("server.stream_write"):
        return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def error_event(message: str, type_: str = "server_error") -> bytes:
    return event(error_body(message, type_))


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


def sse_response(body: AsyncIterator[bytes], streams: Sequence[Any]) -> SSEResponse:
    async def close() -> None:
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)

    return SSEResponse(body, close)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so aborting its engine requests) as soon as the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
        raise
    if task in done:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected("client disconnected; request aborted")
