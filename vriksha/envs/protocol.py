"""The environment server's wire protocol: messages, error codes and errors.

WebSocket (`/v1/ws`; one connection is one session):

- server -> client, first: `{"event": "hello", "session_id", "resume_token", "env", "protocol",
  "max_sessions", "active_sessions", "heartbeat_s", "idle_timeout_s", "resumed"}`
- client -> server: `{"id": <str|int>, "op": "reset"|"step"|"state"|"tools"|"call_tool"|"ping"|"close", ...}`
  with `seed`/`options` (reset), `action` (step), `name`/`arguments` (call_tool)
- resuming (`/v1/ws?session=ID`), and every HTTP call on `/v1/sessions/{id}`, needs the session's
  resume token in the `X-Vriksha-Resume-Token` header (or `&token=` on the WebSocket URL): the id
  names a session, the token proves that the caller is the client that created it
- server -> client, one per request, echoing its id: `{"id", "ok": true, "result": ...}` or
  `{"id", "ok": false, "error": {"code", "message"}}`
- server -> client, unprompted: `{"event": "heartbeat", "t"}` every `heartbeat_s` (independent of
  WebSocket pings), `{"event": "closing", "reason"}` before the server ends a session.

The HTTP session API (`/v1/sessions...`) carries the same results and error bodies. These pydantic
models document the protocol (published at `/schema`) and validate HTTP bodies; the WebSocket hot
path checks plain dicts and validates only the action.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vriksha.envs.core import EnvError, EpisodeStateError, InvalidActionError, ToolError
from vriksha.errors import VrikshaError
from vriksha.net.fields import ValidText

try:
    import orjson

    def dumps(obj: Any) -> str:
        return orjson.dumps(obj).decode()

    loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is optional; the stdlib does the same, slower
    import json

    def dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))

    loads = json.loads

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
WS_PATH = "/v1/ws"
SESSIONS_PATH = "/v1/sessions"
RESUME_TOKEN_HEADER = "X-Vriksha-Resume-Token"

_U64 = 2**64  # seeds and integer ids fit in 64 bits

OPS = ("reset", "step", "state", "tools", "call_tool", "ping", "close")


class ErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"
    UNKNOWN_OP = "unknown_op"
    INVALID_ACTION = "invalid_action"
    EPISODE_STATE = "episode_state"
    TOOL_ERROR = "tool_error"
    UNKNOWN_SESSION = "unknown_session"
    CAPACITY_REACHED = "capacity_reached"
    SESSION_BUSY = "session_busy"
    SESSION_FORBIDDEN = "session_forbidden"
    ENV_ERROR = "env_error"
    SERVER_ERROR = "server_error"


# HTTP status for each code on the HTTP session API.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.INVALID_MESSAGE: 400,
    ErrorCode.UNKNOWN_OP: 400,
    ErrorCode.INVALID_ACTION: 422,
    ErrorCode.EPISODE_STATE: 409,
    ErrorCode.TOOL_ERROR: 422,
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.CAPACITY_REACHED: 503,
    ErrorCode.SESSION_BUSY: 409,
    ErrorCode.SESSION_FORBIDDEN: 403,
    ErrorCode.ENV_ERROR: 500,
    ErrorCode.SERVER_ERROR: 500,
}


# ---------------------------------------------------------------- errors


class EnvServerError(VrikshaError):
    """An error the environment server reports to one session; it carries a wire code."""

    code: ErrorCode = ErrorCode.SERVER_ERROR

    def __init__(self, message: str, code: ErrorCode | None = None, **details: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        return {"code": str(self.code), "message": str(self), **self.details}


class ProtocolError(EnvServerError):
    """A message that is not valid JSON or not a valid request."""

    code = ErrorCode.INVALID_MESSAGE


class UnknownSessionError(EnvServerError):
    """No live session has that id (never created, closed, or reaped after idling)."""

    code = ErrorCode.UNKNOWN_SESSION


class SessionForbiddenError(EnvServerError):
    """The caller did not prove it owns the session: its resume token was missing or wrong."""

    code = ErrorCode.SESSION_FORBIDDEN


class SessionCapacityError(EnvServerError):
    """The server already holds its maximum number of concurrent sessions."""

    code = ErrorCode.CAPACITY_REACHED


class RemoteEnvError(VrikshaError):
    """The client's view of an error the server answered with; `code` is the wire code."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.remote_message = message
        self.details = details or {}


class EnvConnectionError(VrikshaError, ConnectionError):
    """The client could not reach the environment server or lost it and could not reconnect."""


def error_from_exception(exc: BaseException) -> EnvServerError:
    """Map any exception raised while serving a request to a wire error."""
    if isinstance(exc, EnvServerError):
        return exc
    if isinstance(exc, InvalidActionError):
        return EnvServerError(str(exc), ErrorCode.INVALID_ACTION)
    if isinstance(exc, EpisodeStateError):
        return EnvServerError(str(exc), ErrorCode.EPISODE_STATE)
    if isinstance(exc, ToolError):
        return EnvServerError(str(exc), ErrorCode.TOOL_ERROR)
    if isinstance(exc, ValidationError):
        return ProtocolError(f"invalid message: {exc.errors(include_url=False)}")
    if isinstance(exc, EnvError):
        return EnvServerError(str(exc), ErrorCode.ENV_ERROR)
    logger.error("environment code raised", exc_info=exc)
    return EnvServerError(f"the environment raised {type(exc).__name__}: {exc}", ErrorCode.ENV_ERROR)


# ---------------------------------------------------------------- messages


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


RequestId = str | int


class ResetRequest(ValidText, _Msg):
    id: RequestId | None = None
    op: Literal["reset"] = "reset"
    seed: int | None = Field(default=None, ge=0, lt=_U64, description="same seed, same episode")
    options: dict[str, Any] | None = Field(default=None, description='e.g. {"split": "test"}')


class StepRequest(ValidText, _Msg):
    id: RequestId | None = None
    op: Literal["step"] = "step"
    action: dict[str, Any] = Field(description="validated against the environment's action schema")


class CallToolRequest(ValidText, _Msg):
    id: RequestId | None = None
    op: Literal["call_tool"] = "call_tool"
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class SimpleRequest(_Msg):
    id: RequestId | None = None
    op: Literal["state", "tools", "ping", "close"]


class ErrorBody(_Msg):
    code: ErrorCode
    message: str


class Response(_Msg):
    id: RequestId | None
    ok: bool
    result: Any = None
    error: ErrorBody | None = None


class Hello(_Msg):
    event: Literal["hello"] = "hello"
    session_id: str
    resume_token: str = Field(description="the secret that resumes this session; keep it private")
    env: str
    protocol: int = PROTOCOL_VERSION
    max_sessions: int
    active_sessions: int
    heartbeat_s: float
    idle_timeout_s: float
    resumed: bool = False


class Heartbeat(_Msg):
    event: Literal["heartbeat"] = "heartbeat"
    t: float


class SessionInfo(_Msg):
    session_id: str
    resume_token: str = Field(description="send it as X-Vriksha-Resume-Token on every call on this session")
    env: str
    max_sessions: int
    active_sessions: int
    idle_timeout_s: float


class HttpResetBody(ValidText, _Msg):
    seed: int | None = Field(default=None, ge=0, lt=_U64)
    options: dict[str, Any] | None = None


class HttpStepBody(ValidText, _Msg):
    action: dict[str, Any]


class HttpToolBody(ValidText, _Msg):
    arguments: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- checking a WebSocket request

_MAX_ID_CHARS = 256


def _typename(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def request_id(msg: dict[str, Any]) -> str | int | None:
    """The request's id, checked: a string (at most 256 characters) or a 64-bit integer; None if absent."""
    rid = msg.get("id")
    if rid is None:
        return None
    kind = type(rid)
    if kind is str and len(rid) <= _MAX_ID_CHARS:
        return rid
    if kind is int and -(2**63) <= rid < _U64:
        return rid
    if kind is str:
        raise ProtocolError(f"'id' is {len(rid)} characters long; at most {_MAX_ID_CHARS} are allowed")
    if kind is int:
        raise ProtocolError("'id' must fit in 64 bits")
    raise ProtocolError(f"'id' must be a string or an integer, got {_typename(rid)}")


def check_request(op: Any, msg: dict[str, Any]) -> str:
    """Check the fields of one request (a plain dict, on the hot path); returns the op."""
    if op is None:
        raise ProtocolError(f"every request needs an 'op', one of {', '.join(OPS)}")
    if type(op) is not str:
        raise ProtocolError(f"'op' must be a string, one of {', '.join(OPS)}; got {_typename(op)}")
    if op == "reset":
        seed, options = msg.get("seed"), msg.get("options")
        if seed is not None and (type(seed) is not int or not 0 <= seed < _U64):
            raise ProtocolError(f"'seed' must be an integer from 0 to 2**64 - 1 or null, got {seed!r:.60}")
        if options is not None and type(options) is not dict:
            raise ProtocolError(f"'options' must be a JSON object or null, got {_typename(options)}")
    elif op == "step":
        if "action" not in msg:
            raise ProtocolError("a step needs an 'action' object")
    elif op == "call_tool":
        name, arguments = msg.get("name"), msg.get("arguments")
        if type(name) is not str:
            raise ProtocolError(f"call_tool needs a string 'name', got {_typename(name)}")
        if arguments is not None and type(arguments) is not dict:
            raise ProtocolError(f"call_tool 'arguments' must be a JSON object, got {_typename(arguments)}")
    return op


def protocol_schema() -> dict[str, Any]:
    """JSON schemas of every message, for `/schema`."""
    models: dict[str, type[BaseModel]] = {
        "hello": Hello,
        "heartbeat": Heartbeat,
        "reset": ResetRequest,
        "step": StepRequest,
        "call_tool": CallToolRequest,
        "simple": SimpleRequest,
        "response": Response,
    }
    return {
        "version": PROTOCOL_VERSION,
        "websocket": WS_PATH,
        "sessions": SESSIONS_PATH,
        "ops": list(OPS),
        "error_codes": [str(c) for c in ErrorCode],
        "messages": {k: m.model_json_schema() for k, m in models.items()},
    }
