"""Bearer-token check for `--api-key`, as ASGI middleware (also covers streaming endpoints)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from vriksha.server.errors import error_response


def _presented_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


class APIKeyMiddleware:
    """Answers 401 in OpenAI's error schema unless `Authorization: Bearer <key>` (or `x-api-key`) matches."""

    def __init__(self, app: ASGIApp, api_key: str, exempt: frozenset[str]) -> None:
        self.app = app
        self.api_key = api_key.encode()
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        key = _presented_key(scope)
        if key is None:
            message = (
                "missing API key: send `Authorization: Bearer <key>` with the key the server was started with"
            )
        elif not hmac.compare_digest(key.encode(), self.api_key):
            message = "incorrect API key provided; use the key given to `vriksha serve --api-key`"
        else:
            await self.app(scope, receive, send)
            return
        response = error_response(401, message, "invalid_request_error", "invalid_api_key")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
