"""Serving an ASGI app behind the front: uvicorn configured with the front's limits, the descriptor limit raised
and repeated log messages rate-limited when the server starts."""

from __future__ import annotations

import logging
from typing import Any

import uvicorn

from vriksha.net.body import BodyLimit
from vriksha.net.config import FrontConfig
from vriksha.net.fdlimit import raise_fd_limit
from vriksha.net.head import HeadLimit
from vriksha.net.logfilter import install_repeat_filter
from vriksha.net.protocol import guarded_protocol

logger = logging.getLogger(__name__)


def front_config(app: Any, host: str, port: int, front: FrontConfig, **uvicorn_kwargs: Any) -> uvicorn.Config:
    """A `uvicorn.Config` serving `app` with the front's limits; other uvicorn options pass through."""
    front.validate()
    uvicorn_kwargs.setdefault("http", guarded_protocol(front))
    return uvicorn.Config(
        HeadLimit(BodyLimit(app, front.max_body_bytes, front.body_timeout_s), front.max_header_bytes),
        host=host,
        port=port,
        timeout_keep_alive=front.keep_alive_timeout_s,  # type: ignore[arg-type]  # used as a float
        h11_max_incomplete_event_size=front.max_header_bytes,
        ws_max_size=front.max_body_bytes,
        **uvicorn_kwargs,
    )


class FrontServer(uvicorn.Server):
    """A uvicorn server that, as it starts, raises the descriptor limit and rate-limits repeated log lines; with
    `ready`, it logs "ready on http://HOST:PORT: <ready>" at INFO once it accepts connections."""

    def __init__(self, config: uvicorn.Config, front: FrontConfig, ready: str | None = None) -> None:
        super().__init__(config)
        self.front = front
        self.ready = ready

    async def serve(self, sockets: Any = None) -> None:
        raise_fd_limit(self.front.fd_limit)
        install_repeat_filter(self.front.log_repeat_limit, self.front.log_repeat_window_s)
        await super().serve(sockets)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.ready is not None and not self.should_exit:
            logger.info("ready on %s: %s", self.url(), self.ready)

    def url(self) -> str:
        """Where the server listens (the bound port, where the config asked for port 0)."""
        host, port = self.config.host, self.config.port
        for server in getattr(self, "servers", []):
            for sock in server.sockets or ():
                port = sock.getsockname()[1]
                break
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"
