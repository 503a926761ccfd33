"""The drain after SIGTERM: new requests get 503, in-flight ones run on until the shutdown timeout, then each
is answered with the documented 503 (or, in a stream, an error event and `[DONE]`)."""

from __future__ import annotations

import asyncio
import time

from vriksha.server.admission import Admission
from vriksha.server.errors import ShuttingDownError


class Drain:
    def __init__(self, admission: Admission, timeout_s: float) -> None:
        self.admission = admission
        self.timeout_s = timeout_s
        self.expired = asyncio.Event()
        self.began_at: float | None = None
        self.expired_at: float | None = None

    @property
    def draining(self) -> bool:
        return self.admission.draining

    def begin(self) -> None:
        """Start draining (in the event loop's thread); the deadline fires `timeout_s` from now."""
        if self.began_at is not None:
            return
        self.began_at = time.monotonic()
        self.admission.draining = True
        asyncio.get_running_loop().call_later(self.timeout_s, self._expire)

    def _expire(self) -> None:
        self.expired_at = time.monotonic()
        self.expired.set()

    def remaining_s(self) -> float | None:
        if self.began_at is None:
            return None
        return max(0.0, self.began_at + self.timeout_s - time.monotonic())

    def error(self) -> ShuttingDownError:
        return ShuttingDownError(
            f"the server shut down before this request finished (--shutdown-timeout={self.timeout_s:g} s); "
            "retry it on another replica",
            headers={"Retry-After": str(self.admission.retry_after_s)},
        )
