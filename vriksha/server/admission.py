"""The waiting-queue bound: requests admitted but not yet given their first token."""

from __future__ import annotations

from vriksha.server.errors import ServerOverloadedError, ShuttingDownError


class Admission:
    """Counts waiting requests; `admit()` raises 503 (with Retry-After) beyond `max_waiting`, or when draining."""

    def __init__(self, max_waiting: int, retry_after_s: int = 1) -> None:
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self.waiting = 0
        self.in_flight = 0
        self.draining = False

    def admit(self) -> None:
        headers = {"Retry-After": str(self.retry_after_s)}
        if self.draining:
            raise ShuttingDownError(
                "the server is shutting down and takes no new requests; retry on another replica",
                headers=headers,
            )
        if self.waiting >= self.max_waiting:
            raise ServerOverloadedError(
                f"the server is overloaded: {self.waiting} requests are already waiting for their first token "
                f"(bound --max-waiting={self.max_waiting}); retry after {self.retry_after_s} s",
                headers=headers,
            )
        self.waiting += 1
        self.in_flight += 1

    def started(self) -> None:
        """The request got its first output (or failed before): it no longer waits."""
        self.waiting -= 1

    def done(self) -> None:
        self.in_flight -= 1
