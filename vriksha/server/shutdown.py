"""Graceful shutdown: on SIGTERM or SIGINT the server keeps listening but drains (`/health` says so, new
requests get 503), lets in-flight requests finish within the timeout (then answers each with a 503 or an
in-band error event), shuts the engine down, and exits 0."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from vriksha.net import FrontConfig, FrontServer
from vriksha.server.drain import Drain

logger = logging.getLogger(__name__)

# after the drain deadline, time for the cut requests to write their 503s and error events
CUT_GRACE_S = 5.0


class GracefulServer(FrontServer):
    """A front server that drains on the first signal instead of closing its listener at once, exits 0 (uvicorn
    re-raises the signal, which turns a clean shutdown into exit status 143); a second SIGINT forces the exit."""

    def __init__(
        self,
        config: uvicorn.Config,
        front: FrontConfig,
        drain: Drain,
        in_flight: Callable[[], int],
        failure: Callable[[], BaseException | None] = lambda: None,
        ready: str | None = None,
    ) -> None:
        super().__init__(config, front, ready)
        self.drain = drain
        self.in_flight = in_flight
        self.failure = failure  # the engine's fatal error: the server exits at once
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.began_at is not None or self._loop is None or not self.started:
            if sig == signal.SIGINT and self.should_exit:
                self.force_exit = True
            self.should_exit = True
            return
        logger.warning(
            "received %s: draining (timeout %.0f s); /health answers 503",
            signal.Signals(sig).name,
            self.drain.timeout_s,
        )
        self._loop.call_soon_threadsafe(self.drain.begin)

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit and self.failure() is not None:
            logger.error("the engine failed; the server exits: %s", self.failure())
            self.should_exit = True
        drain = self.drain
        if drain.began_at is not None and not self.should_exit:
            if self.in_flight() == 0:
                logger.info("drained: no request in flight")
                self.should_exit = True
            elif drain.expired_at is not None and time.monotonic() > drain.expired_at + CUT_GRACE_S:
                logger.warning("%d requests still in flight after the drain; closing", self.in_flight())
                self.should_exit = True
        return await super().on_tick(counter)
