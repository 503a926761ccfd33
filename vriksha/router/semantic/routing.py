"""One request through the semantic front: classify it, walk its routes (falling through pools with no live
replica), answer from the semantic cache or forward it to the chosen pool, and relabel the answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from vriksha.net.offload import off_loop
from vriksha.router.app import parse_request
from vriksha.router.proxy import NoReplicaError
from vriksha.router.semantic import rewrite
from vriksha.router.semantic.cache import SemanticCache, scope_key
from vriksha.router.semantic.classify import Classified
from vriksha.router.semantic.decisions import Route
from vriksha.router.semantic.signals import SignalValues
from vriksha.router.semantic.state import PoolRuntime, SemanticState
from vriksha.server.errors import ModelNotFoundError, ServerError

ROUTE_HEADER = "x-vriksha-route"  # pool=...; decision=...; reason=...
FALLTHROUGH_HEADER = "x-vriksha-fallthrough"  # the pools skipped for want of a live replica
CACHE_HEADER = "x-vriksha-cache"  # hit; similarity=0.97 | miss | skip


class BlockedError(ServerError, type="invalid_request_error", code="blocked_by_policy"):
    """A block decision refused the request, with the status the decision names."""

    def __init__(self, message: str, status: int, headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.status = status


def _header_value(text: str, limit: int = 400) -> str:
    flat = " ".join(text.split()).replace('"', "'")
    return flat.encode("ascii", "replace").decode()[:limit]


def route_header(route: Route) -> str:
    return _header_value(f"pool={route.pool or '-'}; decision={route.decision}; reason={route.reason}")


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else auth
    return request.headers.get("x-api-key")


class _CacheStep:
    """What the semantic cache said for one route: a hit's answer, or where to store the pool's answer."""

    __slots__ = ("hit", "scope", "cache_emb", "static_emb", "pending_emb")

    def __init__(self) -> None:
        self.hit: Response | None = None
        self.scope: str | None = None
        self.cache_emb: Any = None
        self.static_emb: Any = None
        self.pending_emb: asyncio.Future | None = None


class SemanticRouting:
    """One chat or completion request, from its arrival to the pool's relabelled answer."""

    def __init__(self, state: SemanticState, request: Request, path: str, model: type[BaseModel]) -> None:
        self.state, self.request, self.path, self.model = state, request, path, model
        self.arrived = time.perf_counter()
        self.skipped: list[str] = []
        self.emb: Any = None

    async def answer(self) -> Response:
        state, metrics = self.state, self.state.metrics
        raw = await self.request.body()
        self.req = parse_request(self.model, raw)
        self.body = json.loads(raw)
        self.text = rewrite.routing_text(self.body)
        async for route in self._routes(await self._classified()):
            if route.pool is None:
                metrics.blocked.labels(route.decision).inc()
                raise BlockedError(
                    route.block_message, route.block_status, {ROUTE_HEADER: route_header(route)}
                )
            rt = state.pools[route.pool]
            if not rt.pool.healthy():
                self._fell_through(route.pool)
                continue
            out = rewrite.apply(self.body, route.changes, await rt.served_name(state.http))
            headers = {ROUTE_HEADER: route_header(route)}
            if self.skipped:
                headers[FALLTHROUGH_HEADER] = _header_value(
                    ", ".join(f"{s} (no live replica)" for s in self.skipped)
                )
            step = await self._cache_step(route, out, headers) if state.cache is not None else None
            if step is not None and step.hit is not None:
                return step.hit
            answer = await self._forward(rt, route, out, headers, step)
            if answer is not None:
                return answer
        raise NoReplicaError(
            f"no pool can take this request: {', '.join(self.skipped)} have no live replica; retry shortly",
            headers={"Retry-After": "1", FALLTHROUGH_HEADER: _header_value(", ".join(self.skipped))},
        )

    async def _classified(self) -> Classified:
        state, req = self.state, self.req
        if req.model in state.pools:
            return Classified(
                [Route("explicit", req.model, None, "the client named the pool")], SignalValues(), None
            )
        if req.model == state.cfg.virtual_model:
            result = await state.classifier.classify(self.text)
            state.metrics.decide_seconds.observe(result.decide_s)
            return result
        names = [state.cfg.virtual_model, *state.pools]
        raise ModelNotFoundError(
            f"the model {req.model!r} does not exist here; ask for {state.cfg.virtual_model!r} to be routed or a "
            f"pool by name: {names} (see GET /v1/models)",
            param="model",
        )

    async def _routes(self, result: Classified) -> AsyncIterator[Route]:
        """The routes in order; once the settled ones all fell through, the classifier completes the rest."""
        metrics = self.state.metrics
        self.emb = result.emb
        if self.emb is not None:
            metrics.embed_seconds.observe(result.embed_s)
        i = 0
        while True:
            if i == len(result.routes):
                if result.complete:
                    return
                had = self.emb
                result = await self.state.classifier.complete(self.text, result, self.emb)
                self.emb = result.emb
                if had is None:
                    metrics.embed_seconds.observe(result.embed_s)
            i += 1
            yield result.routes[i - 1]

    def _fell_through(self, pool: str) -> None:
        self.skipped.append(pool)
        self.state.metrics.fallthrough.labels(pool).inc()

    async def _cache_step(self, route: Route, out: dict[str, Any], headers: dict[str, str]) -> _CacheStep:
        state, metrics, text = self.state, self.state.metrics, self.text
        cache, classifier = state.cache, state.classifier
        assert cache is not None
        step = _CacheStep()
        if not (bool(text) and not self.req.stream):
            headers[CACHE_HEADER] = "skip"
            return step
        if not (state.cfg.cache.cache_sampled or not rewrite.sampled(out)):
            headers[CACHE_HEADER] = "skip"
            return step
        key = hashlib.sha256((presented_key(self.request) or "").encode()).hexdigest()
        step.scope = scope_key(key, route.pool, self.path, out, text)
        if classifier.cache_batcher is not None:  # static routing, transformer cache
            step.static_emb = self.emb if self.emb is not None else (await classifier.embed(text))[0]
        floor = state.cfg.cache.prefilter
        if (
            step.static_emb is not None
            and floor is not None
            and not cache.might_hit(step.scope, step.static_emb, floor)
        ):
            # a miss by the cheap vectors: the cache's vector is computed while the pool answers
            step.pending_emb = asyncio.ensure_future(classifier.cache_vector(text, self.emb))
            found = None
        else:
            step.cache_emb, embed_s, shared = await classifier.cache_vector(text, self.emb)
            if embed_s:
                metrics.embed_seconds.observe(embed_s)
            if shared:
                self.emb = step.cache_emb
            found = cache.lookup(step.scope, step.cache_emb, text)
        if found is not None:
            metrics.cache_hits.labels(route.pool).inc()
            metrics.routes.labels(route.decision, route.pool).inc()
            headers[CACHE_HEADER] = f"hit; similarity={found[1]:.3f}"
            step.hit = Response(found[0], 200, media_type="application/json", headers=headers)
            return step
        metrics.cache_misses.labels(route.pool).inc()
        headers[CACHE_HEADER] = "miss"
        return step

    async def _forward(
        self,
        rt: PoolRuntime,
        route: Route,
        out: dict[str, Any],
        headers: dict[str, str],
        step: _CacheStep | None,
    ) -> Response | None:
        """The pool's relabelled answer, or None when the pool had no replica to take it."""
        step = step or _CacheStep()
        new_raw = json.dumps(out).encode()
        new_req = parse_request(self.model, new_raw)
        tokenize = rt.tokens.chat if self.path.endswith("chat/completions") else rt.tokens.completion
        ids = await off_loop(len(new_raw), tokenize, new_req)  # a long prompt: tokenized on a thread
        try:
            resp = await rt.forwarder.forward(
                self.request.headers, self.path, new_raw, ids, bool(self.req.stream), self.arrived
            )
        except NoReplicaError:
            if step.pending_emb is not None:
                step.pending_emb.cancel()
            self._fell_through(route.pool)
            return None
        self.state.metrics.routes.labels(route.decision, route.pool).inc()
        if step.pending_emb is not None:  # computed during the forward: stored before the answer leaves
            step.cache_emb = (await step.pending_emb)[0]
        return relabel(
            resp,
            route.pool,
            headers,
            self.state.cache,
            step.scope,
            (step.cache_emb, step.static_emb),
            self.text,
        )


def relabel(
    resp: Response,
    pool: str,
    headers: dict[str, str],
    cache: SemanticCache | None,
    scope: str | None,
    vectors: tuple[Any, Any],
    text: str,
) -> Response:
    """The response with `model` set to the pool's name and the route headers; cached if it may be."""
    if isinstance(resp, StreamingResponse):
        resp.body_iterator = _relabel_stream(resp.body_iterator, pool)
        resp.headers.update(headers)
        return resp
    content = resp.body
    if resp.status_code == 200:
        try:
            obj = json.loads(content)
            obj["model"] = pool
            content = json.dumps(obj).encode()
        except (ValueError, TypeError):
            pass
        if scope is not None and cache is not None:
            cache.store(scope, vectors[0], text, content, prefilter_emb=vectors[1])
    out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length",)}
    out_headers.update(headers)
    return Response(content, resp.status_code, headers=out_headers)


async def _relabel_stream(chunks: AsyncIterator[bytes], pool: str) -> AsyncIterator[bytes]:
    """SSE events with `model` set to the pool's name (events are re-split on blank lines)."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            yield _relabel_event(event, pool) + b"\n\n"
    if buf:
        yield _relabel_event(buf, pool)


def _relabel_event(event: bytes, pool: str) -> bytes:
    if not event.startswith(b"data: {"):
        return event
    try:
        obj = json.loads(event[6:])
    except ValueError:
        return event
    if "model" in obj:
        obj["model"] = pool
    return b"data: " + json.dumps(obj).encode()
