"""A request to a rollout server or router that may be down for a while: its launcher (the Ray launcher does)
is starting it again at the same URL. The request waits for /health and is sent again; a restarted server answers
under another weight version, which `ServerRollout.generate` sees and re-syncs."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from vriksha.errors import VrikshaError
from vriksha.net.health import wait_healthy

logger = logging.getLogger(__name__)

__all__ = ["UNAVAILABLE", "post_until_answered"]

UNAVAILABLE = (502, 503, 504)  # a router whose replica is gone, a server draining or starting


def post_until_answered(
    http: httpx.Client, url: str, body: dict[str, Any], timeout_s: float
) -> httpx.Response:
    """POST `body` to `url`; while the server is unreachable or unavailable, wait for it (at most `timeout_s` in
    all) and send again. Any other answer is returned as it is."""
    base = url.rsplit("/", 1)[0]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = http.post(url, json=body)
            if r.status_code not in UNAVAILABLE:
                return r
            reason = f"{r.status_code}: {r.text[:200]}"
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
        if time.monotonic() > deadline:
            raise VrikshaError(f"{url}: no answer within rollout.recovery_timeout_s ({reason})")
        logger.warning("%s unavailable (%s); waiting for it", url, reason)
        wait_healthy(base, max(1.0, deadline - time.monotonic()), "rollout server")
