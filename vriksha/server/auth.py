"""Who may call what, as ASGI middleware (it also covers streaming endpoints).

`APIKeyMiddleware` checks the client API key (`--api-key`) alone: the router's own endpoints. `RoleMiddleware`
gives every path of a replica the role whose credential it needs (vriksha.net.trust):

- internal (`--internal-key`): the K/V transfer endpoints (`/kv/...`) and `/kv_events/...`: replicas and
  routers only, never a client, whatever `--auth-exempt` says;
- weights (`--weights-key`): the weight-update endpoints, pause and resume, the prefix cache reset;
- `/load`: the API key or the internal key (a router polls it); `/weight_version`: the API key or the
  weights key;
- every other path: the API key when one is set, else open; `--auth-exempt` paths are open.

A role whose key the server was not given is closed (403 naming the flag that opens it). A caller's role is
left in the request scope's state (`auth_role`) for endpoints that answer each role differently.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from vriksha.net.trust import INTERNAL_HEADER, INTERNAL_KEY_ENV, WEIGHTS_HEADER, WEIGHTS_KEY_ENV
from vriksha.server.errors import error_response

USER, INTERNAL, WEIGHTS, PUBLIC = "user", "internal", "weights", "public"

WEIGHT_PATHS = frozenset(
    {
        "/init_weight_transfer_engine",
        "/init_communicator",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/close_communicator",
        "/pause",
        "/pause_generation",
        "/resume",
        "/resume_generation",
        "/reset_prefix_cache",
        "/weight_specs",
        "/weight_digests",
    }
)
INTERNAL_PREFIXES = ("/kv/", "/kv_events/")
_SHARED = {"/load": (USER, INTERNAL), "/weight_version": (USER, WEIGHTS)}
_FLAG = {INTERNAL: "--internal-key", WEIGHTS: "--weights-key"}
_HEADER = {INTERNAL: INTERNAL_HEADER.encode(), WEIGHTS: WEIGHTS_HEADER.encode()}
_ENV = {INTERNAL: INTERNAL_KEY_ENV, WEIGHTS: WEIGHTS_KEY_ENV}
_WHO = {
    INTERNAL: "replicas and routers (K/V transfer, cache events)",
    WEIGHTS: "trainers (weight updates, pause and resume)",
}


def _presented_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1").strip()
    return None


def _matches(given: str | None, key: bytes) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key)


def _user_refusal(scope: Scope) -> str:
    if _presented_key(scope) is None:
        return "missing API key: send `Authorization: Bearer <key>` with the key the server was started with"
    return "incorrect API key provided; use the key given to `vriksha serve --api-key`"


def _refuse(status: int, message: str, code: str) -> JSONResponse:
    response = error_response(status, message, "invalid_request_error", code)
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


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
        if _matches(_presented_key(scope), self.api_key):
            await self.app(scope, receive, send)
            return
        await _refuse(401, _user_refusal(scope), "invalid_api_key")(scope, receive, send)


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    api_key: str | None = None
    internal_key: str | None = None
    weights_key: str | None = None
    exempt: frozenset[str] = frozenset()

    def roles(self, path: str) -> tuple[str, ...]:
        """The roles any one of which may call `path`."""
        if path.startswith(INTERNAL_PREFIXES):
            return (INTERNAL,)
        if path in WEIGHT_PATHS:
            return (WEIGHTS,)
        if path in self.exempt:
            return (PUBLIC,)
        return _SHARED.get(path, (USER,))

    def _key(self, role: str) -> str | None:
        return {USER: self.api_key, INTERNAL: self.internal_key, WEIGHTS: self.weights_key}.get(role)

    def role_of(self, scope: Scope, path: str) -> str | None:
        """The first role of `path` whose credential the request presents, else the first open one (a role
        that needs no credential); None when neither."""
        opened = None
        for role in self.roles(path):
            if role == PUBLIC or (role == USER and self.api_key is None):
                opened = opened or role
                continue
            key = self._key(role)
            if key is None:
                continue
            given = _presented_key(scope) if role == USER else _header(scope, _HEADER[role])
            if _matches(given, key.encode()):
                return role
        return opened

    def refusal(self, scope: Scope, path: str) -> tuple[int, str, str]:
        """Why a request for `path` presenting no matching credential is refused: (status, message, code)."""
        roles = self.roles(path)
        if roles == (USER,):
            return 401, _user_refusal(scope), "invalid_api_key"
        open_roles = [r for r in roles if r == USER or self._key(r) is not None]
        if not open_roles:
            role = roles[0]
            return (
                403,
                f"{path} is for {_WHO[role]}, and this server was started without {_FLAG[role]}: the endpoint is "
                f"closed (start the server with {_FLAG[role]} or ${_ENV[role]})",
                "endpoint_closed",
            )
        wanted = [
            "the API key (`Authorization: Bearer <key>`)"
            if role == USER
            else f"the {role} key in the `{_HEADER[role].decode()}` header (a client API key never works here)"
            for role in open_roles
        ]
        return 401, f"{path} needs " + " or ".join(wanted), "invalid_api_key"


class RoleMiddleware:
    """Admits a request only with a credential of a role its path allows (see `AccessPolicy.roles`)."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        role = self.policy.role_of(scope, path)
        if role is not None:
            scope.setdefault("state", {})["auth_role"] = role
            await self.app(scope, receive, send)
            return
        status, message, code = self.policy.refusal(scope, path)
        await _refuse(status, message, code)(scope, receive, send)
