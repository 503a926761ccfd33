"""The session protocol over plain HTTP: `POST /v1/sessions`, `POST /v1/sessions/{id}/reset|step`,
`GET /v1/sessions/{id}/state|tools`, `POST /v1/sessions/{id}/tools/{name}`, `DELETE /v1/sessions/{id}`; each
call on a session carries its resume token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from vriksha.envs.app_state import EnvAppState, EnvState
from vriksha.envs.protocol import (
    RESUME_TOKEN_HEADER,
    SESSIONS_PATH,
    EnvServerError,
    ErrorCode,
    HttpResetBody,
    HttpStepBody,
    HttpToolBody,
    ProtocolError,
    error_from_exception,
    loads,
)

router = APIRouter()


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    data: Any = {}
    if raw:
        try:
            data = loads(raw)
        except Exception as exc:
            raise EnvServerError(f"the body is not valid JSON: {exc}", ErrorCode.INVALID_JSON) from None
        if not isinstance(data, dict):
            raise ProtocolError("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error_from_exception(exc) from None


def _owned(state: EnvAppState, session_id: str, request: Request, action: str) -> Any:
    return state.manager.authorize(session_id, request.headers.get(RESUME_TOKEN_HEADER), action)


async def _http_op(
    state: EnvAppState, session_id: str, request: Request, op: str, msg: dict[str, Any]
) -> Response:
    session = _owned(state, session_id, request, "use")
    try:
        out = await state.dispatch(session, op, msg)
    except Exception as exc:
        raise error_from_exception(exc) from None
    return Response(out, media_type="application/json")


@router.post(SESSIONS_PATH, status_code=201)
async def create_session(state: EnvState) -> dict[str, Any]:
    session = await state.manager.create("http")
    return {
        "session_id": session.id,
        "resume_token": session.token,
        "env": state.env_cls.name,
        **state.manager.capacity(),
        "idle_timeout_s": state.config.idle_timeout_s,
    }


@router.post(SESSIONS_PATH + "/{session_id}/reset")
async def http_reset(session_id: str, request: Request, state: EnvState) -> Response:
    body = await _body(request, HttpResetBody)
    return await _http_op(state, session_id, request, "reset", {"seed": body.seed, "options": body.options})


@router.post(SESSIONS_PATH + "/{session_id}/step")
async def http_step(session_id: str, request: Request, state: EnvState) -> Response:
    body = await _body(request, HttpStepBody)
    return await _http_op(state, session_id, request, "step", {"action": body.action})


@router.get(SESSIONS_PATH + "/{session_id}/state")
async def http_state(session_id: str, request: Request, state: EnvState) -> Response:
    return await _http_op(state, session_id, request, "state", {})


@router.get(SESSIONS_PATH + "/{session_id}/tools")
async def http_tools(session_id: str, request: Request, state: EnvState) -> Response:
    return await _http_op(state, session_id, request, "tools", {})


@router.post(SESSIONS_PATH + "/{session_id}/tools/{name}")
async def http_call_tool(session_id: str, name: str, request: Request, state: EnvState) -> Response:
    body = await _body(request, HttpToolBody)
    msg = {"name": name, "arguments": body.arguments}
    return await _http_op(state, session_id, request, "call_tool", msg)


@router.delete(SESSIONS_PATH + "/{session_id}")
async def http_close(session_id: str, request: Request, state: EnvState) -> dict[str, Any]:
    _owned(state, session_id, request, "delete")
    await state.manager.close(session_id, reason="client closed")
    return {"closed": True, "session_id": session_id}
