"""What the environment server's routes share, built once per app and handed to them through `Depends`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends
from starlette.requests import HTTPConnection

from vriksha.envs.core import Environment
from vriksha.envs.protocol import PROTOCOL_VERSION, SESSIONS_PATH, WS_PATH
from vriksha.envs.sessions import Dispatcher, SessionManager

if TYPE_CHECKING:
    from vriksha.envs.server import EnvServerConfig


@dataclass(slots=True)
class EnvAppState:
    manager: SessionManager
    dispatch: Dispatcher
    env_cls: type[Environment]
    config: EnvServerConfig

    def server_info(self) -> dict[str, Any]:
        config = self.config
        return {
            "protocol": PROTOCOL_VERSION,
            **self.manager.capacity(),
            "idle_timeout_s": config.idle_timeout_s,
            "detach_grace_s": self.manager.detach_grace_s,
            "heartbeat_s": config.heartbeat_s,
            "endpoints": {
                "websocket": WS_PATH,
                "sessions": SESSIONS_PATH,
                "mcp": "/mcp" if config.mcp else None,
                "openenv_websocket": "/ws" if config.openenv else None,
            },
        }


def env_state(connection: HTTPConnection) -> EnvAppState:
    return connection.app.state.env


EnvState = Annotated[EnvAppState, Depends(env_state)]
