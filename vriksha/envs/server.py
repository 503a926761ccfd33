"""The environment server: one FastAPI app per environment, served by uvicorn.

Routes (see `protocol.py` for the messages), each an `APIRouter` over the app's `EnvAppState` (`app_state.py`,
handed to the routes through `Depends`):
- `WS /v1/ws[?session=ID]`: one connection is one session (`ws_session.py`);
- `POST /v1/sessions`, ...: the same over plain HTTP, each call on a session with its resume token
  (`routes_sessions.py`);
- `GET /health`, `/metadata`, `/schema` (`routes_info.py`);
- `/mcp`: the episode's tools over MCP streamable HTTP (`mcp_server.py`);
- OpenEnv's wire format on OpenEnv's paths (`/ws`, `/reset`, `/step`, `/state`; `openenv_compat.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from vriksha.envs import routes_info, routes_sessions, ws_session
from vriksha.envs.app_state import EnvAppState
from vriksha.envs.core import Environment
from vriksha.envs.protocol import HTTP_STATUS, PROTOCOL_VERSION, EnvServerError
from vriksha.envs.sessions import Dispatcher, SessionManager
from vriksha.net import FrontConfig
from vriksha.options import Options, option

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class EnvServerConfig(Options):
    """The environment server's options; those declared with `option()` are also `vriksha env serve`'s flags."""

    options_label: ClassVar[str] = "environment server"
    flag_dest_prefix: ClassVar[str] = "env_server_"

    host: str = option("127.0.0.1", "interface to bind (127.0.0.1: loopback only)")
    port: int = option(8000, "TCP port")
    max_sessions: int = option(64, "cap on concurrent sessions of all kinds")
    idle_timeout_s: float = option(
        300.0, "close a session after this many seconds without a request", flag="idle-timeout"
    )
    detach_grace_s: float = option(
        30.0, "keep a session whose WebSocket dropped resumable for this many seconds", flag="detach-grace"
    )
    heartbeat_s: float = option(
        15.0,
        "send an application heartbeat to each WebSocket client every this many seconds",
        flag="heartbeat",
    )
    workers: int | None = option(None, "threads running env code (default: sessions + 4, at most 64)")
    mcp: bool = True  # `--no-mcp`
    openenv: bool = True  # `--no-openenv`
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # `--env-arg KEY=VALUE`
    # connections, deadlines, body and header caps, descriptor limit, log rate (`--max-connections`, ...)
    front: FrontConfig = field(default_factory=FrontConfig)

    @classmethod
    def internal_fields(cls) -> tuple[str, ...]:
        """Fields that are not options of their own here (flags of another form, sections)."""
        return tuple(f.name for f in dataclasses.fields(cls) if "help" not in f.metadata)


def resolve_env_class(env: str | type[Environment]) -> type[Environment]:
    if isinstance(env, str):
        from vriksha.envs.registry import get_env_class

        return get_env_class(env)
    if isinstance(env, type) and issubclass(env, Environment):
        return env
    raise TypeError(f"expected an environment name or Environment subclass, got {env!r}")


# ---------------------------------------------------------------- the app


def create_app(env: str | type[Environment], config: EnvServerConfig | None = None) -> FastAPI:
    """Build the server app for an environment name (registry) or class."""
    config = config or EnvServerConfig()
    env_cls = resolve_env_class(env)
    kwargs = dict(config.env_kwargs)
    manager = SessionManager(
        lambda: env_cls(**kwargs),
        max_sessions=config.max_sessions,
        idle_timeout_s=config.idle_timeout_s,
        detach_grace_s=config.detach_grace_s,
        workers=config.workers,
    )
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
    app.state.env = EnvAppState(manager, Dispatcher(manager), env_cls, config)
    app.state.config = config
    app.add_exception_handler(EnvServerError, _env_error)  # type: ignore[arg-type]
    for routes in (routes_info.router, ws_session.router, routes_sessions.router):
        app.include_router(routes)
    if config.openenv:
        from vriksha.envs.openenv_compat import register_openenv_routes

        register_openenv_routes(app, manager, env_cls)
    if mcp_app is not None:
        mcp_app.mount(app)
    return app


async def _env_error(request: Request, exc: EnvServerError) -> JSONResponse:
    return JSONResponse({"error": exc.to_wire()}, status_code=HTTP_STATUS.get(exc.code, 500))


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
        front = config.front if isinstance(config, EnvServerConfig) else FrontConfig()
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
    env: str | type[Environment], config: EnvServerConfig | None = None, log_level: str = "warning"
) -> None:
    """Serve an environment until interrupted (what `vriksha env serve` runs)."""
    from vriksha.net import FrontServer

    config = config or EnvServerConfig()
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
