"""ASGI middleware: read each request body up front, capped in size (413) and in time (408), before the app
sees it; the app then reads the buffered body, and later `receive()` calls (disconnect watching) pass through."""

from __future__ import annotations

import asyncio
from typing import Any

from vriksha.net.protocol import error_json

Scope = dict[str, Any]
Message = dict[str, Any]


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def _reply(self, send: Any, status: int, body: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _too_large(self, size: int | None) -> bytes:
        got = f" (this one has {size} bytes)" if size is not None else ""
        return error_json(
            f"the request body is larger than the server's cap of {self.max_bytes} bytes{got} "
            "(--max-body-bytes); send a smaller request",
            "invalid_request_error",
            "request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reply(send, 413, self._too_large(declared))
            return
        chunks: list[bytes] = []
        size = 0
        try:
            # one deadline for the whole body (asyncio.wait_for per message would start a task for each)
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # nothing to answer
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:
                        break
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            body = error_json(
                f"the request body did not arrive within {self.timeout_s:g} s (--body-timeout)",
                "invalid_request_error",
                "request_timeout",
            )
            await self._reply(send, 408, body)
            return
        if size > self.max_bytes:
            await self._reply(send, 413, self._too_large(None))
            return
        buffered: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            if buffered:
                return buffered.pop()
            return await receive()

        await self.app(scope, replay, send)
