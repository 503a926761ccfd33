"""The router's hot POST endpoints served as raw ASGI, ahead of FastAPI's routing, request objects and
dependency solving (most of the Python time of a tiny forwarded request). The handlers are the app's own
endpoint functions, so both paths parse, route, forward and count the same way; whatever they raise
answers as FastAPI's error handlers would. Any other method or path reaches the FastAPI app unchanged
(a GET on a hot path still gets FastAPI's 405)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from vriksha.server.errors import exception_response

# (the request's headers, its body, when it arrived: time.perf_counter()) -> the response
Handler = Callable[[Headers, bytes, float], Awaitable[Response]]


class _Disconnected(Exception):
    """The client left before its body arrived: nothing to answer."""


async def read_body(receive: Receive) -> bytes:
    message = await receive()  # one message for a body the front (net.body.BodyLimit) has read already
    if message["type"] == "http.disconnect":
        raise _Disconnected
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class HotPaths:
    """ASGI middleware: a POST to one of `routes`' paths goes to its handler; everything else to `app`."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, Handler]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        arrived = time.perf_counter()
        try:
            response = await handler(Headers(scope=scope), await read_body(receive), arrived)
        except _Disconnected:
            return
        except Exception as exc:  # noqa: BLE001 - answered as the app's error handlers answer it
            response = exception_response(exc)
        await response(scope, receive, send)
