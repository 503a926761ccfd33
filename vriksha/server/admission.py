"""The waiting-queue bound, in sequences: every prompt of a request times its `n`, admitted but not yet given
its first token. A request that alone asks for more than the bound can never fit and gets 400; one that does
not fit beside those already waiting gets 503 with Retry-After."""

from __future__ import annotations

from vriksha.server.errors import BadRequestError, ServerOverloadedError, ShuttingDownError


class TooManySequencesError(BadRequestError, code="too_many_sequences"):
    """One request asks for more sequences (prompts x n) than the server lets wait at once."""


class Admission:
    """Counts waiting sequences; `admit(k)` raises 503 (with Retry-After) when `k` more would pass `max_waiting`,
    or when draining. `in_flight` counts the engine requests being served."""

    def __init__(self, max_waiting: int, retry_after_s: int = 1) -> None:
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self.waiting = 0
        self.in_flight = 0
        self.draining = False

    def check_size(self, sequences: int, prompts: int, n: int) -> None:
        """400 when a request of `prompts` prompts with `n` sequences each (`sequences` in all) can never fit."""
        if sequences > self.max_waiting:
            raise TooManySequencesError(
                f"this request asks for {sequences} sequences ({prompts} prompt{'s' if prompts != 1 else ''} x "
                f"n={n}) but the server lets at most {self.max_waiting} wait for their first token "
                f"(--max-waiting); send fewer prompts per request or a smaller n",
                param="n" if prompts == 1 else "prompt",
            )

    def admit(self, sequences: int = 1) -> None:
        headers = {"Retry-After": str(self.retry_after_s)}
        if self.draining:
            raise ShuttingDownError(
                "the server is shutting down and takes no new requests; retry on another replica",
                headers=headers,
            )
        self.check_size(sequences, 1, sequences)
        if self.waiting + sequences > self.max_waiting:
            raise ServerOverloadedError(
                f"the server is overloaded: {self.waiting} sequences are already waiting for their first token "
                f"and this request adds {sequences} (bound --max-waiting={self.max_waiting}); retry after "
                f"{self.retry_after_s} s",
                headers=headers,
            )
        self.waiting += sequences
        self.in_flight += 1

    def started(self, sequences: int = 1) -> None:
        """`sequences` got their first output (or failed before): they no longer wait."""
        self.waiting -= sequences

    def done(self) -> None:
        self.in_flight -= 1
