"""Forwarding one request: to the chosen replica; to another one while nothing has reached the client yet
(connection refused or reset, 503); once a stream has started, a failure ends it with an error event."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import aiohttp
import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import Headers

from vriksha.kv_events.schema import keyed
from vriksha.router.disagg import Disaggregation
from vriksha.router.pool import ReplicaPool
from vriksha.router.replica import Replica
from vriksha.router.upstream import TRANSPORT_ERRORS, Upstream
from vriksha.server.errors import ServerError
from vriksha.server.sse import DONE, SSE_HEADERS, error_event

logger = logging.getLogger(__name__)

_FORWARDED = ("authorization", "x-api-key", "content-type", "x-request-id", "accept")
_RETURNED = ("content-type", "retry-after", "x-request-id")
REPLICA_HEADER = "x-vriksha-replica"  # which replica answered


class NoReplicaError(ServerError, status=503, type="server_overloaded", code="no_healthy_replica"):
    """No replica can take the request (none is healthy, or none has what the request needs)."""


class _Attempt(Exception):
    """This replica failed before anything reached the client: try another."""


def forwarded_headers(headers: Headers) -> dict[str, str]:
    """The client's headers a replica sees (its key, body type, request id)."""
    return {k: v for k, v in headers.items() if k.lower() in _FORWARDED}


class Forwarder:
    """Forwards on its own `Upstream` (aiohttp); `http` (httpx) serves the P/D transfers. `aclose()` it."""

    def __init__(self, pool: ReplicaPool, http: httpx.AsyncClient) -> None:
        self.pool = pool
        self.http = http
        self.upstream = Upstream(pool.config.request_timeout_s, pool.config.connect_timeout_s)
        self.disagg = Disaggregation(pool, http)

    async def aclose(self) -> None:
        await self.upstream.aclose()

    async def forward(
        self,
        headers: Headers,
        path: str,
        body: bytes,
        prompt: list[int],
        stream: bool,
        arrived: float,
        lora: str | None = None,
        session: str | None = None,
    ) -> Response:
        """`headers`: the client request's (`request.headers`, or `Headers(scope=scope)` in raw ASGI). `lora`:
        the LoRA adapter the request names; its prefix is looked up in the mirrors' tree of that adapter.
        `session`: the body's `session_id` (else the session header's value): the session stays on one replica."""
        tokens = keyed(
            prompt, lora
        )  # the routing key: the prompt, behind the adapter's key when there is one
        session = session or headers.get(self.pool.config.session_header)
        forwarded = forwarded_headers(headers)
        tried: set[int] = set()
        last_error = "no replica is healthy"
        while True:
            decision = self.pool.choose(tokens, session, tried)
            if decision is None:
                raise NoReplicaError(
                    f"no replica can take this request ({last_error}); retry shortly",
                    headers={"Retry-After": "1"},
                )
            r = decision.replica
            tried.add(r.index)
            if not tried - {r.index}:
                self.pool.metrics.overhead.observe(time.perf_counter() - arrived)
            if lora is None and self.disagg.wanted(r, tokens, decision.cached_tokens):
                await self.disagg.prefill(r, tokens)
            try:
                return await self._attempt(r, forwarded, path, body, tokens, stream)
            except _Attempt as exc:
                last_error = f"{r.url}: {exc}"
                self.pool.metrics.retries.labels(r.url).inc()
                logger.warning(
                    "request to %s failed before any output (%s); trying another replica", r.url, exc
                )

    async def _attempt(
        self, r: Replica, headers: dict[str, str], path: str, body: bytes, tokens: list[int], stream: bool
    ) -> Response:
        r.in_flight += 1
        upstream: aiohttp.ClientResponse | None = None
        handed_over = False
        try:
            try:
                upstream = await self.upstream.post(f"{r.url}{path}", body, headers)
            except TRANSPORT_ERRORS as exc:
                self.pool.eject(r, f"{type(exc).__name__}: {exc}")
                raise _Attempt(type(exc).__name__) from exc
            if upstream.status == 503:
                raise _Attempt("503 (overloaded or shutting down)")
            if not stream or upstream.status != 200:
                try:
                    content = await upstream.read()
                except TRANSPORT_ERRORS as exc:
                    self.pool.eject(r, f"{type(exc).__name__}: {exc}")
                    raise _Attempt(type(exc).__name__) from exc
                self._count(r, path, upstream.status)
                return Response(content, upstream.status, headers=self._returned(upstream, r))
            chunks = upstream.content.iter_any()
            try:
                first = await anext(chunks)
            except StopAsyncIteration:
                first = b""
            except TRANSPORT_ERRORS as exc:
                self.pool.eject(r, f"{type(exc).__name__}: {exc}")
                raise _Attempt(type(exc).__name__) from exc
            handed_over = True
            return StreamingResponse(
                self._relay(r, path, upstream, first, chunks, tokens),
                status_code=200,
                media_type="text/event-stream",
                headers={**SSE_HEADERS, REPLICA_HEADER: r.url},
            )
        finally:
            if not handed_over:
                r.in_flight -= 1
                r.settle_pending(tokens)
                if upstream is not None:
                    upstream.release()  # back to the pool if its body was read, else the connection closes

    async def _relay(
        self,
        r: Replica,
        path: str,
        upstream: aiohttp.ClientResponse,
        first: bytes,
        chunks: AsyncIterator[bytes],
        tokens: list[int],
    ) -> AsyncIterator[bytes]:
        status = "200"
        try:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk
        except TRANSPORT_ERRORS as exc:
            status = "stream_error"
            self.pool.metrics.stream_errors.labels(r.url).inc()
            self.pool.eject(r, f"{type(exc).__name__} mid-stream")
            yield b"\n\n" + error_event(
                f"the replica serving this request failed mid-stream ({type(exc).__name__}); the output above is "
                "incomplete: retry the request",
                "server_error",
            )
            yield DONE
        finally:
            r.in_flight -= 1
            r.settle_pending(tokens)
            self.pool.metrics.requests.labels(r.url, path, status).inc()
            upstream.release()

    def _count(self, r: Replica, path: str, status: int) -> None:
        self.pool.metrics.requests.labels(r.url, path, str(status)).inc()

    @staticmethod
    def _returned(upstream: aiohttp.ClientResponse, r: Replica) -> dict[str, str]:
        out = {k: v for k, v in upstream.headers.items() if k.lower() in _RETURNED}
        out[REPLICA_HEADER] = r.url
        return out
