"""An environment's tools over the Model Context Protocol (official `mcp` SDK, streamable HTTP at `/mcp`).

Only tools are exposed: the agent sees tools, while `reset`/`step` stay with the infrastructure
(OpenEnv's invariant). Which environment instance answers a call:
- the vriksha session named by the `X-Vriksha-Session` request header, when given (an agent using
  the tools of an episode a trainer drives over `/v1/ws`);
- otherwise one session per MCP session (`Mcp-Session-Id`), created on first use with a fresh
  episode and reaped like any other idle session;
- otherwise (stateless requests) one shared session.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from vriksha.envs.core import Environment
from vriksha.envs.protocol import EnvServerError, UnknownSessionError, error_from_exception
from vriksha.envs.sessions import Session, SessionManager

if TYPE_CHECKING:
    from fastapi import FastAPI

    from vriksha.envs.server import EnvServerConfig

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-vriksha-session"
MCP_PATH = "/mcp"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class McpApp:
    """The MCP server for one environment server: tools of the right session, mounted at `/mcp`."""

    def __init__(self, manager: SessionManager, env_cls: type[Environment], config: EnvServerConfig) -> None:
        self.manager = manager
        self.env_cls = env_cls
        self._by_mcp_session: dict[str, str] = {}
        self.server: Server[Any] = Server(
            f"vriksha-{env_cls.name}",
            version="1",
            instructions=f"Tools of the vriksha environment {env_cls.name!r}.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        security = None
        if config.host in _LOOPBACK:
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        self.sessions = StreamableHTTPSessionManager(
            app=self.server,
            security_settings=security,
            session_idle_timeout=config.idle_timeout_s,
            max_sessions=config.max_sessions,
        )

    def run(self) -> AbstractAsyncContextManager[None]:
        return self.sessions.run()

    def mount(self, app: FastAPI) -> None:
        app.router.routes.append(
            Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(self.sessions), methods=["GET", "POST", "DELETE"])
        )

    # -- which session --------------------------------------------------------------

    async def _session_for(self, ctx: Any) -> Session:
        headers = getattr(getattr(ctx, "request", None), "headers", None) or {}
        wanted = headers.get(SESSION_HEADER)
        if wanted:
            return self.manager.get(wanted)
        key = headers.get("mcp-session-id") or "shared"
        sid = self._by_mcp_session.get(key)
        if sid is not None:
            session = self.manager.find(sid)
            if session is not None:
                return session
            del self._by_mcp_session[key]  # reaped after idling: start a fresh episode
        # forget MCP sessions whose env sessions are gone, so the map stays as small as the server
        for stale in [k for k, v in self._by_mcp_session.items() if self.manager.find(v) is None]:
            del self._by_mcp_session[stale]
        session = await self.manager.create("mcp")
        await self.manager.run(session, session.env.reset, None, None)
        self._by_mcp_session[key] = session.id
        return session

    # -- handlers --------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        try:
            session = await self._session_for(ctx)
            tools = await self.manager.run(session, session.env.tools)
        except EnvServerError as exc:
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=types.INVALID_REQUEST, message=str(exc)) from None
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in tools
            ]
        )

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            session = await self._session_for(ctx)
            output = await self.manager.run(
                session, session.env.call_tool, params.name, dict(params.arguments or {})
            )
        except UnknownSessionError as exc:
            return _error_result(str(exc))
        except Exception as exc:  # a tool's failure is the agent's to read, not a protocol error
            return _error_result(str(error_from_exception(exc)))
        return types.CallToolResult(content=[types.TextContent(type="text", text=output)])


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def build_mcp(manager: SessionManager, env_cls: type[Environment], config: EnvServerConfig) -> McpApp:
    return McpApp(manager, env_cls, config)
