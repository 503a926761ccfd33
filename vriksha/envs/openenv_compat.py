"""OpenEnv's wire format on OpenEnv's paths, so the real `openenv-core` clients drive vriksha envs.

- `WS /ws`: messages `{"type": "reset"|"step"|"state"|"close", "data": {...}}`; answers
  `{"type": "observation", "data": {"observation", "reward", "done"}}`, `{"type": "state", "data"}`
  or `{"type": "error", "data": {"message", "code"}}` (OpenEnv's codes). Step data may also be
  OpenEnv's tool actions `{"type": "list_tools"}` / `{"type": "call_tool", "tool_name", "arguments"}`
  (what `openenv.core.mcp_client.MCPToolClient` sends), answered from the env's tools.
- `POST /reset`, `POST /step`, `GET /state`: OpenEnv's stateless HTTP endpoints (a fresh env per
  call; `/step` resets it first with the body's `seed`). Use `/v1/sessions` for real HTTP sessions.

The vriksha `StepResult` maps to OpenEnv's shape with `done = terminated or truncated`; the
vriksha-only fields (`terminated`, `truncated`, `components`, `success`, `info`) ride along in
`data`, and `from_openenv` reads them back. Every connection plays its episodes through an
`EpisodeDriver`, the turn protocol the other paths share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

from vriksha.envs.app_state import EnvState
from vriksha.envs.core import Environment, StepResult
from vriksha.envs.episode import EpisodeDriver, answer_tool_call
from vriksha.envs.protocol import (
    ErrorCode,
    ProtocolError,
    SessionCapacityError,
    dumps,
    error_from_exception,
    loads,
)
from vriksha.envs.sessions import Session, SessionManager

logger = logging.getLogger(__name__)

# vriksha wire codes -> OpenEnv's WSErrorCode values
_OPENENV_CODES = {
    ErrorCode.INVALID_JSON: "INVALID_JSON",
    ErrorCode.UNKNOWN_OP: "UNKNOWN_TYPE",
    ErrorCode.INVALID_MESSAGE: "VALIDATION_ERROR",
    ErrorCode.INVALID_ACTION: "VALIDATION_ERROR",
    ErrorCode.CAPACITY_REACHED: "CAPACITY_REACHED",
    ErrorCode.UNKNOWN_SESSION: "SESSION_ERROR",
}


def to_openenv(result: StepResult) -> dict[str, Any]:
    obs = result.observation.model_dump(mode="json")
    return {
        "observation": obs,
        "reward": result.reward,
        "done": result.terminated or result.truncated,
        "terminated": result.terminated,
        "truncated": result.truncated,
        "components": result.components,
        "success": result.success,
        "info": result.info,
    }


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < 2**64:  # as the session protocol's seeds
        raise ProtocolError(f"'seed' must be an integer from 0 to 2**64 - 1 or null, got {value!r:.60}")
    return value


def from_openenv(data: dict[str, Any]) -> StepResult:
    """The vriksha `StepResult` of an observation message's `data` (what `to_openenv` wrote)."""
    return StepResult(
        observation=data.get("observation") or {},
        reward=float(data.get("reward") or 0.0),
        terminated=bool(data.get("terminated", data.get("done", False))),
        truncated=bool(data.get("truncated", False)),
        components=data.get("components") or {},
        success=data.get("success"),
        info=data.get("info") or {},
    )


def _reset_args(data: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    data = dict(data or {})
    seed = _seed(data.pop("seed", None))
    data.pop("episode_id", None)  # vriksha makes its own episode ids
    options = data.pop("options", None) or {}
    options.update(data)
    return seed, (options or None)


def _action_dict(driver: EpisodeDriver, data: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's typed actions carry `metadata`; drop it unless the vriksha action has that field."""
    if "metadata" in data and not driver.shape.accepts("metadata"):
        data = {k: v for k, v in data.items() if k != "metadata"}
    return data


def _tool_step(env: Environment, data: dict[str, Any]) -> dict[str, Any]:
    if data.get("type") == "list_tools":
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in env.tools()
        ]
        return {"observation": {"tools": tools, "metadata": {}}, "reward": None, "done": False}
    name = data.get("tool_name", "")
    answered = answer_tool_call(env, name, data.get("arguments") or {})
    result, error = answered.output, None
    if answered.error:
        result, error = (
            None,
            {"error_type": "execution_error", "message": answered.output.removeprefix("error: ")},
        )
    return {
        "observation": {"tool_name": name, "result": result, "error": error, "metadata": {}},
        "reward": None,
        "done": False,
    }


def _driver(env: Environment, drivers: dict[int, EpisodeDriver]) -> EpisodeDriver:
    """The connection's driver of `env` (one per environment instance)."""
    if id(env) not in drivers:
        drivers[id(env)] = EpisodeDriver(env)
    return drivers[id(env)]


def _step(env: Environment, data: Any, drivers: dict[int, EpisodeDriver]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError("step 'data' must be a JSON object (the action)")
    driver = _driver(env, drivers)
    if data.get("type") in ("list_tools", "call_tool") and not driver.shape.accepts("type"):
        return _tool_step(env, data)
    return to_openenv(driver.step(_action_dict(driver, data)))


def _reset(env: Environment, data: Any, drivers: dict[int, EpisodeDriver]) -> dict[str, Any]:
    seed, options = _reset_args(data if isinstance(data, dict) else {})
    return to_openenv(_driver(env, drivers).reset(seed, options))


def _state(env: Environment) -> dict[str, Any]:
    return env.state.model_dump(mode="json")


def _error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


router = APIRouter()


def register_openenv_routes(app: FastAPI, manager: SessionManager, env_cls: type[Environment]) -> None:
    """OpenEnv's paths on the environment server's app (whose `EnvAppState` holds `manager`)."""
    app.include_router(router)


@router.websocket("/ws")
async def openenv_ws(websocket: WebSocket, state: EnvState) -> None:
    manager = state.manager
    await websocket.accept()
    try:
        session = await manager.create("openenv")
    except Exception as exc:
        code = "CAPACITY_REACHED" if isinstance(exc, SessionCapacityError) else "FACTORY_ERROR"
        details = exc.details if isinstance(exc, SessionCapacityError) else {}
        # answer the client's first message (OpenEnv clients always speak first), then close:
        # an error sent before that races the client's send against our close
        with contextlib.suppress(Exception):
            await asyncio.wait_for(websocket.receive_text(), 10.0)
        with contextlib.suppress(Exception):
            await websocket.send_text(dumps(_error(str(exc), code, **details)))
            await websocket.close()
        return

    async def on_close(reason: str) -> None:
        with contextlib.suppress(Exception):
            await websocket.close(code=1001)

    session.on_close = on_close
    drivers: dict[int, EpisodeDriver] = {}
    try:
        while True:
            raw = await websocket.receive_text()
            reply = await _handle(manager, session, raw, drivers)
            if reply is None:
                break
            await websocket.send_text(reply)
    except Exception:
        logger.debug("openenv websocket session %s ended", session.id, exc_info=True)
    finally:
        await manager.close(session.id, reason="openenv client left")
        with contextlib.suppress(Exception):
            await websocket.close()


async def _handle(
    manager: SessionManager, session: Session, raw: str, drivers: dict[int, EpisodeDriver]
) -> str | None:
    try:
        msg = loads(raw)
    except Exception as exc:
        return dumps(_error(f"Invalid JSON: {exc}", "INVALID_JSON"))
    if not isinstance(msg, dict):
        return dumps(_error("a message must be a JSON object with a 'type'", "VALIDATION_ERROR"))
    kind = msg.get("type", "")
    env = session.env
    try:
        if kind == "reset":
            data = await manager.run(session, _reset, env, msg.get("data") or {}, drivers)
            return dumps({"type": "observation", "data": data})
        if kind == "step":
            session.steps += 1
            data = await manager.run(session, _step, env, msg.get("data"), drivers)
            return dumps({"type": "observation", "data": data})
        if kind == "state":
            return dumps({"type": "state", "data": await manager.run(session, _state, env)})
        if kind == "close":
            return None
        return dumps(_error(f"Unknown message type: {kind}", "UNKNOWN_TYPE"))
    except Exception as exc:
        err = error_from_exception(exc)
        return dumps(_error(str(err), _OPENENV_CODES.get(err.code, "EXECUTION_ERROR")))


async def _oneshot(manager: SessionManager, fn: Any, *args: Any) -> Any:
    env = await manager.workers.submit(manager.factory)
    try:
        return await manager.workers.submit(fn, env, *args)
    finally:
        env.close()


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    data = loads(raw) if raw else {}
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


def _http_error(exc: Exception) -> JSONResponse:
    err = error_from_exception(exc)
    status = 422 if err.code in (ErrorCode.INVALID_ACTION, ErrorCode.INVALID_MESSAGE) else 500
    return JSONResponse({"detail": str(err), "code": str(err.code)}, status_code=status)


@router.post("/reset")
async def openenv_reset(request: Request, state: EnvState) -> Any:
    try:
        return await _oneshot(state.manager, _reset, await _json(request), {})
    except Exception as exc:
        return _http_error(exc)


def _reset_then_step(env: Environment, body: dict[str, Any]) -> dict[str, Any]:
    drivers: dict[int, EpisodeDriver] = {}
    _driver(env, drivers).reset(_seed(body.get("seed")), None)
    return _step(env, body.get("action"), drivers)


@router.post("/step")
async def openenv_step(request: Request, state: EnvState) -> Any:
    try:
        return await _oneshot(state.manager, _reset_then_step, await _json(request))
    except Exception as exc:
        return _http_error(exc)


def _fresh_state(env: Environment) -> dict[str, Any]:
    env.reset(0, None)
    return _state(env)


@router.get("/state")
async def openenv_state(state: EnvState) -> Any:
    try:
        return await _oneshot(state.manager, _fresh_state)
    except Exception as exc:
        return _http_error(exc)
