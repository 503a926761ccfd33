"""The router's hot POST endpoints served as raw ASGI, ahead of FastAPI (its per-request middleware,
routing, request objects and dependency solving are most of the Python time of a tiny forwarded request).
A hot path's handler is the one function FastAPI's route for it calls too, so both parse, route, forward
and count the same way; whatever it raises answers as the app's error handlers would."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
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


class HotPathApp(FastAPI):
    """A FastAPI app that answers a POST to one of its hot paths (`hot_paths()`) itself, ahead of FastAPI's
    per-request work (its telemetry check, middleware stack, routing, request objects, dependency solving);
    every other request goes through FastAPI as usual. FastAPI keeps a route per hot path, serving the same
    handler, so other methods get its 405. Hot requests are outside FastAPI's own OpenTelemetry spans."""

    _hot: dict[str, Handler] = {}

    def hot_paths(
        self, routes: Mapping[str, Handler], wrap: Callable[[ASGIApp], ASGIApp] | None = None
    ) -> None:
        """Serve `routes` (path -> handler) raw; `wrap` is ASGI middleware around them (the API key check)."""
        self._hot = dict(routes)
        self._serve = wrap(self._serve_hot) if wrap is not None else self._serve_hot
        for path, handler in self._hot.items():
            self.add_api_route(path, _fastapi_endpoint(handler), methods=["POST"], include_in_schema=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self._hot:
            await self._serve(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _serve_hot(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.perf_counter()
        try:
            response = await self._hot[scope["path"]](Headers(scope=scope), await read_body(receive), arrived)
        except _Disconnected:
            return
        except Exception as exc:  # noqa: BLE001 - answered as the app's error handlers answer it
            response = exception_response(exc)
        await response(scope, receive, send)


def _fastapi_endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def post(request: Request) -> Response:
        arrived = time.perf_counter()
        return await handler(request.headers, await request.body(), arrived)

    return post
