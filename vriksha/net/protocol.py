"""uvicorn's HTTP protocol with the front's connection limits: a cap on open connections (503 beyond it), a
deadline for each request's headers (408 after it) and a cap on their size (431 beyond it), so slow, idle or
bloated clients cannot hold the server."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from vriksha.net.config import FrontConfig
from vriksha.net.fdlimit import connection_budget, near_fd_limit

logger = logging.getLogger(__name__)

_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
_HEAD_END = b"\r\n\r\n"
REFUSAL_LINGER_S = 1.0  # how long a refused connection may stay open for its client to read the 503


def error_json(message: str, type_: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


def head_too_large(cap: int, size: int | None = None) -> bytes:
    """The 431 body: the request line plus headers exceed `cap` bytes."""
    got = f" (this request's are {size} bytes or more)" if size is not None else ""
    return error_json(
        f"the request line and headers are larger than the server's cap of {cap} bytes{got} "
        "(--max-header-bytes); send fewer or smaller headers",
        "invalid_request_error",
        "request_header_fields_too_large",
    )


def raw_response(status: int, body: bytes, extra: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, written straight to a transport."""
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Guard:
    """Mixed into a uvicorn HTTP protocol class (h11 or httptools) by `guarded_protocol`."""

    front: FrontConfig
    budget: int | None = None  # the connection cap, sized to the descriptor limit at the first connection

    # attributes of the uvicorn protocol this is mixed into
    server_state: Any
    transport: Any
    cycle: Any
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: Any) -> None:
        cls = type(self)
        if cls.budget is None:
            cls.budget = connection_budget(self.front.max_connections)
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._head_refused = False
        self._in_head = True  # the bytes arriving belong to a request line and headers
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes seen, for a head end split across reads
        self._linger: asyncio.TimerHandle | None = None
        open_now = len(self.server_state.connections)
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if open_now >= cls.budget or near_fd_limit(fd):
            self._refuse(transport, open_now, cls.budget, fd)
            return
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_deadline()

    def _refuse(self, transport: Any, open_now: int, budget: int, fd: int) -> None:
        peer = transport.get_extra_info("peername")
        low_fds = near_fd_limit(fd)
        why = (
            f"the server is near its file-descriptor limit (descriptor {fd})"
            if low_fds
            else f"{open_now} connections are open (cap --max-connections={budget})"
        )
        logger.warning("refused a connection from %s: %s", peer, why)
        body = error_json(
            f"too many connections: {why}; retry after 1 s or on another replica",
            "server_overloaded",
            "too_many_connections",
        )
        self._refused = True
        transport.write(raw_response(503, body, {"retry-after": "1"}))
        if low_fds or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # the client reads the 503, then closes; unread input is discarded meanwhile
        self._linger = self.loop.call_later(REFUSAL_LINGER_S, transport.abort)

    def _arm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.front.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is None or transport.is_closing() or transport.get_protocol() is not self:
            return  # closed, or upgraded to a WebSocket
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request's headers arrived in time; it is being served
        logger.info(
            "closed a connection from %s: no complete request headers within %.0f s",
            transport.get_extra_info("peername"),
            self.front.header_timeout_s,
        )
        body = error_json(
            f"the request headers did not arrive within {self.front.header_timeout_s:g} s "
            "(--header-timeout); send the whole request at once",
            "invalid_request_error",
            "request_timeout",
        )
        transport.write(raw_response(408, body))
        transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refused or self._head_refused:
            return
        if self._in_head and not self._count_head(data):
            return
        super().data_received(data)  # type: ignore[misc]

    def _count_head(self, data: bytes) -> bool:
        """Count a request head's bytes as they arrive (however they are split); False once the head is past
        --max-header-bytes: then it was answered 431 and the connection closed. The parser never sees the
        bytes beyond the cap (an incomplete head would otherwise be buffered whole)."""
        window = self._head_tail + data
        end = window.find(_HEAD_END)
        size = self._head_bytes + (len(data) if end == -1 else end + len(_HEAD_END) - len(self._head_tail))
        if size > self.front.max_header_bytes:
            self._refuse_head(size)
            return False
        if end == -1:
            self._head_bytes, self._head_tail = size, window[-(len(_HEAD_END) - 1) :]
        else:  # the rest is the body; the next head is counted from the end of this response on
            self._in_head, self._head_bytes, self._head_tail = False, 0, b""
        return True

    def _refuse_head(self, size: int) -> None:
        transport = self.transport
        logger.info(
            "refused a request from %s: headers past %d bytes (--max-header-bytes)",
            transport.get_extra_info("peername"),
            self.front.max_header_bytes,
        )
        self._head_refused = True
        if self._header_timer is not None:
            self._header_timer.cancel()
        transport.write(raw_response(431, head_too_large(self.front.max_header_bytes, size)))
        transport.close()

    def eof_received(self) -> bool | None:
        if self._refused:
            return False  # close
        return super().eof_received()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._in_head, self._head_bytes, self._head_tail = True, 0, b""
        if not self.transport.is_closing():
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._header_timer, self._linger):
            if timer is not None:
                timer.cancel()
        if self._refused:
            return
        super().connection_lost(exc)  # type: ignore[misc]


def guarded_protocol(front: FrontConfig, base: type | None = None) -> type:
    """A subclass of uvicorn's HTTP protocol (httptools when installed, else h11) with the front's limits."""
    if base is None:
        import importlib.util

        if importlib.util.find_spec("httptools") is not None:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        else:
            from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type(f"Guarded{base.__name__}", (_Guard, base), {"front": front, "budget": None})
