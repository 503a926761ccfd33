"""Server errors and their mapping to OpenAI's error schema: `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vriksha.errors import (
    EngineFailedError,
    InvalidRequestError,
    KVTransferError,
    OutOfKVMemoryError,
    PromptTooLongError,
    VrikshaError,
)

logger = logging.getLogger(__name__)


class ServerError(VrikshaError):
    """An error with an HTTP status and an OpenAI error type/code. A subclass declares what it changes in its
    class line: `class ModelNotFoundError(ServerError, status=404, code="model_not_found")`."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init_subclass__(
        cls, status: int | None = None, type: str | None = None, code: str | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in (("status", status), ("type", type), ("code", code)):
            if value is not None:
                setattr(cls, name, value)

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        self.headers = headers or {}


class BadRequestError(ServerError, status=400, type="invalid_request_error"):
    """The request is malformed or asks for something this server cannot do."""


class AuthenticationError(ServerError, status=401, type="invalid_request_error", code="invalid_api_key"):
    """No API key, or the wrong one."""


class ModelNotFoundError(ServerError, status=404, type="invalid_request_error", code="model_not_found"):
    """The request names a model this server does not serve."""


class ConflictError(ServerError, status=409, type="invalid_request_error"):
    """The request conflicts with an operation in progress."""


class ServerOverloadedError(ServerError, status=503, type="server_overloaded", code="server_overloaded"):
    """The waiting queue is at its bound: retry after `Retry-After` seconds."""


class ShuttingDownError(ServerOverloadedError, code="server_shutting_down"):
    """The server is draining after SIGTERM and takes no new requests."""


class WrongRoleError(ServerError, status=404, type="invalid_request_error", code="wrong_role"):
    """A prefill/decode endpoint asked of a replica started with another `--role`."""


class TransferFailedError(ServerError, status=502, type="server_error", code="kv_transfer_failed"):
    """A K/V transfer between replicas could not be made; the request that needed it is not served."""


class StructuredOutputFailedError(
    ServerError, status=400, type="invalid_request_error", code="structured_output_failed"
):
    """The request's grammar failed during generation (past the grammar engine's limits at some token): the
    output cannot be trusted to match it, so none is returned."""


class ToolCallMissingError(ServerError, status=500, code="tool_call_missing"):
    """`tool_choice` forced a call and the reply holds none."""


class ClientDisconnected(ServerError, status=499, type="client_closed_request"):
    """The client went away before its response was ready; its engine requests were aborted."""


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


def to_response(exc: Exception) -> JSONResponse:
    """Any exception raised while serving a request, as an OpenAI error response."""
    if isinstance(exc, ServerError):
        return error_response(exc.status, str(exc), exc.type, exc.code, exc.param, exc.headers)
    if isinstance(exc, PromptTooLongError):
        return error_response(400, str(exc), "invalid_request_error", "context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return error_response(400, str(exc), "invalid_request_error", "invalid_value")
    if isinstance(exc, OutOfKVMemoryError):
        return error_response(400, str(exc), "invalid_request_error", "context_length_exceeded")
    if isinstance(exc, KVTransferError):
        return to_response(TransferFailedError(str(exc)))
    if isinstance(exc, EngineFailedError):
        return error_response(503, str(exc), "server_error", "engine_failed")
    if isinstance(exc, VrikshaError):
        return error_response(500, str(exc), "server_error")
    logger.exception("unhandled error while serving a request", exc_info=exc)
    return error_response(500, f"internal server error: {type(exc).__name__}: {exc}", "server_error")


_BOUNDS = {"le": "at most", "ge": "at least", "lt": "less than", "gt": "greater than"}


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    parts: list[str] = []
    first_param: str | None = None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        # unions report one error per member; keep the path to the field, not the union member names
        loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "list", "dict")]
        field = ".".join(loc) or "body"
        first_param = first_param or field
        kind = err.get("type", "")
        if kind == "json_invalid":
            return (
                f"the request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')}); "
                "send a JSON object with Content-Type: application/json",
                None,
            )
        if kind == "invalid_unicode":  # from net.fields: the message names the path, e.g. messages[0].content
            return str(err.get("msg")), str(err.get("ctx", {}).get("where", field))
        if kind == "extra_forbidden":
            parts.append(f"unrecognized request argument supplied: {field}")
        elif kind == "missing":
            parts.append(f"missing required parameter: {field}")
        else:
            got = json.dumps(err.get("input"), default=str)
            if len(got) > 80:
                got = got[:77] + "..."
            ctx = err.get("ctx") or {}
            bound = next((f"{_BOUNDS[k]} {ctx[k]}" for k in _BOUNDS if k in ctx), None)
            if bound is not None:
                parts.append(f"invalid value for {field}: must be {bound}, got {got}")
            elif kind == "finite_number":
                parts.append(f"invalid value for {field}: must be a finite number, got {got}")
            else:
                parts.append(f"invalid type or value for {field}: {err.get('msg', 'invalid')} (got {got})")
    # unions produce duplicates; keep order, drop repeats
    seen: dict[str, None] = dict.fromkeys(parts)
    return "; ".join(seen) or "invalid request body", first_param


def validation_response(exc: RequestValidationError) -> JSONResponse:
    """A body that failed validation, as a 400 naming the problem (what FastAPI's handler answers here)."""
    message, param = _describe_validation(exc)
    return error_response(400, message, "invalid_request_error", None, param)


def exception_response(exc: Exception) -> JSONResponse:
    """What the handlers below answer for `exc`: for a raw ASGI endpoint that FastAPI's handlers do not see."""
    if isinstance(exc, RequestValidationError):
        return validation_response(exc)
    return to_response(exc)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = str(exc.detail)
        if exc.status_code == 404:
            message = "no such endpoint; see GET /v1/models, POST /v1/completions, POST /v1/chat/completions"
        return error_response(exc.status_code, message, "invalid_request_error", code, None, exc.headers)

    @app.exception_handler(VrikshaError)
    async def _vriksha(_: Request, exc: VrikshaError) -> JSONResponse:
        return to_response(exc)

    @app.exception_handler(Exception)
    async def _any(_: Request, exc: Exception) -> JSONResponse:
        return to_response(exc)
