"""The environment server: one FastAPI app per environment, served by uvicorn.

Routes (see `protocol.py` for the messages):
- `WS /v1/ws[?session=ID]`: one connection is one session (`?session=` with the session's resume
  token resumes a dropped one);
- `POST /v1/sessions`, `POST /v1/sessions/{id}/reset|step`, `GET /v1/sessions/{id}/state|tools`,
  `POST /v1/sessions/{id}/tools/{name}`, `DELETE /v1/sessions/{id}`: the same over plain HTTP, each
  call on a session with its resume token;
- `GET /health`, `/metadata`, `/schema`;
- `/mcp`: the episode's tools over MCP streamable HTTP (`mcp_server.py`);
- OpenEnv's wire format on OpenEnv's paths (`/ws`, `/reset`, `/step`, `/state`; `openenv_compat.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from vriksha.envs.core import Environment, StepResult
from vriksha.envs.protocol import (
    HTTP_STATUS,
    PROTOCOL_VERSION,
    RESUME_TOKEN_HEADER,
    SESSIONS_PATH,
    WS_PATH,
    EnvServerError,
    ErrorCode,
    HttpResetBody,
    HttpStepBody,
    HttpToolBody,
    ProtocolError,
    dumps,
    error_from_exception,
    loads,
    protocol_schema,
    request_id,
)
from vriksha.envs.sessions import Dispatcher, SessionManager
from vriksha.net import FrontConfig

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 64
    idle_timeout_s: float = 300.0
    detach_grace_s: float = 30.0
    heartbeat_s: float = 15.0
    workers: int | None = None  # env thread pool size; default max_sessions + 4 (at most 64)
    mcp: bool = True
    openenv: bool = True
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    # connections, deadlines, body and header caps, descriptor limit, log rate (`--max-connections`, ...)
    front: FrontConfig = field(default_factory=FrontConfig)


def resolve_env_class(env: str | type[Environment]) -> type[Environment]:
    if isinstance(env, str):
        from vriksha.envs.registry import get_env_class

        return get_env_class(env)
    if isinstance(env, type) and issubclass(env, Environment):
        return env
    raise TypeError(f"expected an environment name or Environment subclass, got {env!r}")


def _interrupted() -> EnvServerError:
    return EnvServerError(
        "the request was interrupted (server shutting down?); retry it", ErrorCode.SERVER_ERROR
    )


def _reply_ok(rid_json: str, result_json: str) -> str:
    return '{"id":' + rid_json + ',"ok":true,"result":' + result_json + "}"


def _reply_err(rid_json: str, err: EnvServerError) -> str:
    return '{"id":' + rid_json + ',"ok":false,"error":' + dumps(err.to_wire()) + "}"


# ---------------------------------------------------------------- the app


def create_app(env: str | type[Environment], config: ServerConfig | None = None) -> FastAPI:
    """Build the server app for an environment name (registry) or class."""
    config = config or ServerConfig()
    env_cls = resolve_env_class(env)
    kwargs = dict(config.env_kwargs)
    manager = SessionManager(
        lambda: env_cls(**kwargs),
        max_sessions=config.max_sessions,
        idle_timeout_s=config.idle_timeout_s,
        detach_grace_s=config.detach_grace_s,
        workers=config.workers,
    )
    dispatch = Dispatcher(manager)
    mcp_app = None
    if config.mcp:
        from vriksha.envs.mcp_server import build_mcp

        mcp_app = build_mcp(manager, env_cls, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager.start()
        async with contextlib.AsyncExitStack() as stack:
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.run())
            try:
                yield
            finally:
                await manager.shutdown()

    app = FastAPI(
        title=f"vriksha environment: {env_cls.name}",
        version=str(PROTOCOL_VERSION),
        lifespan=lifespan,
    )
    app.state.manager = manager
    app.state.env_cls = env_cls
    app.state.config = config

    @app.exception_handler(EnvServerError)
    async def _env_error(request: Request, exc: EnvServerError) -> JSONResponse:
        return JSONResponse({"error": exc.to_wire()}, status_code=HTTP_STATUS.get(exc.code, 500))

    # -- info --------------------------------------------------------------

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy", "env": env_cls.name, **manager.capacity()}

    def server_info() -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            **manager.capacity(),
            "idle_timeout_s": config.idle_timeout_s,
            "detach_grace_s": manager.detach_grace_s,
            "heartbeat_s": config.heartbeat_s,
            "endpoints": {
                "websocket": WS_PATH,
                "sessions": SESSIONS_PATH,
                "mcp": "/mcp" if config.mcp else None,
                "openenv_websocket": "/ws" if config.openenv else None,
            },
        }

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        meta = {k: v for k, v in env_cls.metadata().items() if k != "schemas"}
        return {**meta, "version": str(PROTOCOL_VERSION), "server": server_info()}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            **env_cls.schemas(),
            "step_result": StepResult.model_json_schema(),
            "protocol": protocol_schema(),
        }

    # -- WebSocket ---------------------------------------------------------------

    @app.websocket(WS_PATH)
    async def ws_session(websocket: WebSocket) -> None:
        await websocket.accept()
        resume = websocket.query_params.get("session")
        try:
            if resume:
                token = websocket.headers.get(RESUME_TOKEN_HEADER) or websocket.query_params.get("token")
                session = manager.authorize(resume, token, "resume")
                if session.kind != "ws":
                    raise EnvServerError(
                        f"session {resume!r} is a {session.kind} session; only WebSocket sessions resume",
                        ErrorCode.SESSION_BUSY,
                    )
                previous = session.on_close
                session.on_close = None
                # the token holder is the owner, so the connection it leaves is its own stale one
                if session.attached and previous is not None:
                    await previous("resumed on another connection")
            else:
                session = await manager.create("ws")
            manager.attach(session, owner=websocket)
        except EnvServerError as exc:
            await websocket.send_text(dumps({"event": "error", "error": exc.to_wire()}))
            await websocket.close(code=1013 if exc.code == ErrorCode.CAPACITY_REACHED else 1008)
            return
        closed_by_server = False

        async def on_close(reason: str) -> None:
            nonlocal closed_by_server
            closed_by_server = True
            with contextlib.suppress(Exception):
                await websocket.send_text(dumps({"event": "closing", "reason": reason}))
                await websocket.close(code=1001)

        session.on_close = on_close
        await websocket.send_text(
            dumps(
                {
                    "event": "hello",
                    "session_id": session.id,
                    "resume_token": session.token,
                    "env": env_cls.name,
                    "protocol": PROTOCOL_VERSION,
                    **manager.capacity(),
                    "heartbeat_s": config.heartbeat_s,
                    "idle_timeout_s": config.idle_timeout_s,
                    "resumed": bool(resume),
                }
            )
        )
        heartbeat = asyncio.create_task(_heartbeat(websocket, config.heartbeat_s))
        explicit_close = False
        receive, send = websocket.receive, websocket.send_text
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None:
                    raw = message.get("bytes")
                rid_json = "null"
                try:
                    try:
                        msg = loads(raw)
                    except Exception as exc:
                        raise EnvServerError(f"not valid JSON: {exc}", ErrorCode.INVALID_JSON) from None
                    if type(msg) is not dict:
                        raise ProtocolError("a request must be a JSON object with 'id' and 'op'")
                    rid = request_id(msg)
                    if rid is None:
                        if msg.get("op") == "ping":  # an id-less ping is a bare heartbeat
                            session.touch()
                            continue
                        raise ProtocolError("every request needs an 'id' (a string or an integer)")
                    rid_json = dumps(rid)
                    earlier = session.recent.get(rid)
                    if earlier is not None:  # a re-send after a reconnect: answer it, never run it twice
                        await send(await earlier)
                        continue
                    op = msg.get("op")
                    if op == "close":
                        explicit_close = True
                        with contextlib.suppress(Exception):
                            await send(_reply_ok(rid_json, '{"closed":true}'))
                        break
                    answer, reply = session.remember(rid), None
                    try:
                        reply = _reply_ok(rid_json, await dispatch(session, op, msg))
                    except Exception as exc:
                        reply = _reply_err(rid_json, error_from_exception(exc))
                    finally:
                        answer.set_result(reply or _reply_err(rid_json, _interrupted()))
                except Exception as exc:
                    reply = _reply_err(rid_json, error_from_exception(exc))
                if session.closed:
                    break
                await send(reply)
        except Exception:
            if not closed_by_server:
                logger.debug("websocket session %s ended abruptly", session.id, exc_info=True)
        finally:
            heartbeat.cancel()
            if explicit_close:
                await manager.close(session.id, reason="client closed")
                with contextlib.suppress(Exception):
                    await websocket.close()
            elif not session.closed:
                manager.detach(session, owner=websocket)

    # -- HTTP sessions -------------------------------------------------------------

    async def _body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw:
            return {}
        try:
            data = loads(raw)
        except Exception as exc:
            raise EnvServerError(f"the body is not valid JSON: {exc}", ErrorCode.INVALID_JSON) from None
        if not isinstance(data, dict):
            raise ProtocolError("the body must be a JSON object")
        return data

    def _owned(session_id: str, request: Request, action: str) -> Any:
        return manager.authorize(session_id, request.headers.get(RESUME_TOKEN_HEADER), action)

    async def _http_op(session_id: str, request: Request, op: str, msg: dict[str, Any]) -> Response:
        session = _owned(session_id, request, "use")
        try:
            out = await dispatch(session, op, msg)
        except Exception as exc:
            raise error_from_exception(exc) from None
        return Response(out, media_type="application/json")

    @app.post(SESSIONS_PATH, status_code=201)
    async def create_session() -> dict[str, Any]:
        session = await manager.create("http")
        return {
            "session_id": session.id,
            "resume_token": session.token,
            "env": env_cls.name,
            **manager.capacity(),
            "idle_timeout_s": config.idle_timeout_s,
        }

    @app.post(SESSIONS_PATH + "/{session_id}/reset")
    async def http_reset(session_id: str, request: Request) -> Response:
        try:
            body = HttpResetBody.model_validate(await _body(request))
        except ValidationError as exc:
            raise error_from_exception(exc) from None
        return await _http_op(session_id, request, "reset", {"seed": body.seed, "options": body.options})

    @app.post(SESSIONS_PATH + "/{session_id}/step")
    async def http_step(session_id: str, request: Request) -> Response:
        try:
            body = HttpStepBody.model_validate(await _body(request))
        except ValidationError as exc:
            raise error_from_exception(exc) from None
        return await _http_op(session_id, request, "step", {"action": body.action})

    @app.get(SESSIONS_PATH + "/{session_id}/state")
    async def http_state(session_id: str, request: Request) -> Response:
        return await _http_op(session_id, request, "state", {})

    @app.get(SESSIONS_PATH + "/{session_id}/tools")
    async def http_tools(session_id: str, request: Request) -> Response:
        return await _http_op(session_id, request, "tools", {})

    @app.post(SESSIONS_PATH + "/{session_id}/tools/{name}")
    async def http_call_tool(session_id: str, name: str, request: Request) -> Response:
        try:
            body = HttpToolBody.model_validate(await _body(request))
        except ValidationError as exc:
            raise error_from_exception(exc) from None
        return await _http_op(session_id, request, "call_tool", {"name": name, "arguments": body.arguments})

    @app.delete(SESSIONS_PATH + "/{session_id}")
    async def http_close(session_id: str, request: Request) -> dict[str, Any]:
        _owned(session_id, request, "delete")
        await manager.close(session_id, reason="client closed")
        return {"closed": True, "session_id": session_id}

    if config.openenv:
        from vriksha.envs.openenv_compat import register_openenv_routes

        register_openenv_routes(app, manager, env_cls)
    if mcp_app is not None:
        mcp_app.mount(app)
    return app


async def _heartbeat(websocket: WebSocket, every_s: float) -> None:
    try:
        while True:
            await asyncio.sleep(every_s)
            await websocket.send_text('{"event":"heartbeat","t":' + repr(time.time()) + "}")
    except Exception:
        return


# ---------------------------------------------------------------- running it


def uvicorn_config(
    app: Any, host: str, port: int, log_level: str = "warning", front: FrontConfig | None = None
) -> Any:
    """A uvicorn config behind the HTTP front's limits (`front`, default the app's config's), with the fastest
    protocol implementations installed here."""
    import importlib.util

    from vriksha.net import front_config

    if front is None:
        config = getattr(getattr(app, "state", None), "config", None)
        front = config.front if isinstance(config, ServerConfig) else FrontConfig()
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return front_config(
        app,
        host,
        port,
        front,
        ws="websockets-sansio",  # measured faster here than the legacy `websockets` implementation
        loop=loop,
        log_level=log_level,
        access_log=False,
        lifespan="on",
    )


def serve(
    env: str | type[Environment], config: ServerConfig | None = None, log_level: str = "warning"
) -> None:
    """Serve an environment until interrupted (what `vriksha env serve` runs)."""
    from vriksha.net import FrontServer

    config = config or ServerConfig()
    app = create_app(env, config)
    FrontServer(uvicorn_config(app, config.host, config.port, log_level, config.front), config.front).run()


class ServerThread:
    """Run an app under uvicorn in a background thread (tests, notebooks): `with ServerThread(app) as url:`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import socket

        import uvicorn

        # bind here, so port 0 picks a free port with no window for another process to take it
        self.sock = socket.create_server((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, self.host, self.port, log_level))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="vriksha-env-server", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the environment server did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


