"""Graceful shutdown: on SIGTERM or SIGINT stop accepting, let in-flight requests finish within a timeout
(then cancel them, which aborts their engine requests), shut the engine down, exit 0."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType

import uvicorn

logger = logging.getLogger(__name__)


class GracefulServer(uvicorn.Server):
    """A uvicorn server that does not re-raise the signal after its graceful shutdown (uvicorn does, which
    turns a clean SIGTERM shutdown into exit status 143); a second SIGINT still forces the exit."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
            return
        logger.warning(
            "received %s: draining (timeout %.0f s)",
            signal.Signals(sig).name,
            self.config.timeout_graceful_shutdown or 0,
        )
        if self._on_signal is not None:
            self._on_signal()
        self.should_exit = True
