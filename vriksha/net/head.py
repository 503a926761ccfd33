"""ASGI middleware: a request whose line and headers, as parsed, exceed the cap gets 431. The protocol counts
each head's bytes as they arrive (`net.protocol`); this catches a head it could not count, one pipelined
behind an earlier request on the same read."""

from __future__ import annotations

from typing import Any

from vriksha.net.protocol import head_too_large


def head_size(scope: dict[str, Any]) -> int:
    """Bytes of the request line and headers as a client sent them (`METHOD path?query HTTP/1.1`, one
    `name: value` line per header, the blank line)."""
    query = scope.get("query_string", b"")
    path = scope.get("raw_path") or scope.get("path", "").encode()
    line = len(scope.get("method", "GET")) + 1 + len(path) + (1 + len(query) if query else 0) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ())) + 2


class HeadLimit:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        size = head_size(scope) if scope["type"] == "http" else 0
        if size <= self.max_bytes:
            await self.app(scope, receive, send)
            return
        body = head_too_large(self.max_bytes, size)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 431, "headers": headers})
        await send({"type": "http.response.body", "body": body})
