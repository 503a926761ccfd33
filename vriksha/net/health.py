"""Waiting for a service that stopped answering (restarted by its launcher) to answer /health again."""

from __future__ import annotations

import time

import httpx

from vriksha.errors import VrikshaError

__all__ = ["ServiceUnavailable", "wait_healthy"]


class ServiceUnavailable(VrikshaError):
    """A server did not answer /health in the time given."""


def wait_healthy(url: str, timeout_s: float, what: str = "server") -> float:
    """Poll `url`/health until it answers 200; the seconds waited. `ServiceUnavailable` after `timeout_s`."""
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > timeout_s:
            raise ServiceUnavailable(f"the {what} at {url} did not answer /health within {timeout_s:.0f} s")
        time.sleep(0.25)
