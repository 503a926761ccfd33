"""The client that forwards requests to replicas: one aiohttp session (a keep-alive connection pool) for the
router's life. Forwarding is the one HTTP call on every request's path, and aiohttp spends about a third of
the CPU time per request that httpx does (`benchmarks/router_hop.py`); health and load polling, snapshots
and P/D transfers are off that path and stay on httpx."""

from __future__ import annotations

import asyncio

import aiohttp

# a replica that refused, reset, closed mid-body or timed out: what the forwarder retries or ejects on
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)

# an idle pooled connection is dropped before a replica's own keep-alive timeout (5 s by default) would
# close it, so the router never sends a request on a connection the replica is closing
KEEPALIVE_S = 4.0


class Upstream:
    """POSTs raw bytes to replicas; the response comes back with its headers read and its body unread."""

    def __init__(self, request_timeout_s: float, connect_timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=request_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # made on first use: a session belongs to the running event loop
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=self._timeout,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),  # replicas answer uncompressed
            )
        return self._session

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        return await self._open().post(url, data=body, headers=headers, allow_redirects=False)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
