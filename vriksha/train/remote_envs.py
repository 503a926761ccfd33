"""Episodes on environment servers (`vriksha env serve`, `env.servers`): one session per episode, the servers
taken in turn; the action shape from the first server's schema. A server that stops answering (restarted by
its launcher) is waited for, up to `timeout_s`, before a session is refused."""

from __future__ import annotations

import itertools
import logging
import threading

import httpx

from vriksha.envs.client import EnvClient
from vriksha.envs.episode import ActionShape
from vriksha.envs.protocol import EnvConnectionError
from vriksha.net.health import ServiceUnavailable, wait_healthy

logger = logging.getLogger(__name__)

__all__ = ["RemoteEnvs"]


def _wait(url: str, timeout_s: float) -> float:
    try:
        return wait_healthy(url, timeout_s, "environment server")
    except ServiceUnavailable as exc:
        raise EnvConnectionError(str(exc)) from None


class RemoteEnvs:
    def __init__(self, urls: list[str], timeout_s: float = 300.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        self._next = itertools.cycle(range(len(self.urls)))
        self._lock = threading.Lock()
        self._shape: ActionShape | None = None

    @property
    def action_shape(self) -> ActionShape:
        if self._shape is None:
            url = self.urls[0]
            _wait(url, self.timeout_s)
            r = httpx.get(f"{url}/schema", timeout=30)
            r.raise_for_status()
            self._shape = ActionShape.from_schema(r.json()["action"])
        return self._shape

    def session(self) -> EnvClient:
        with self._lock:
            url = self.urls[next(self._next)]
        try:
            return EnvClient(url).connect()
        except EnvConnectionError:
            waited = _wait(url, self.timeout_s)
            logger.warning("environment server %s answers again after %.1f s", url, waited)
            return EnvClient(url).connect()

    def wait_all(self) -> None:
        for url in self.urls:
            _wait(url, self.timeout_s)
