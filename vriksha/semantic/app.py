"""The semantic front: OpenAI endpoints that pick a pool (signals, decisions, the semantic cache) and then
hand the request to that pool's router (replica choice, retries, streaming), all in one process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from vriksha.net.offload import off_loop
from vriksha.router.app import _parse
from vriksha.router.config import ReplicaSpec, RouterConfig
from vriksha.router.metrics import RouterMetrics
from vriksha.router.pool import ReplicaPool
from vriksha.router.proxy import Forwarder, NoReplicaError
from vriksha.router.tokens import PromptTokens
from vriksha.semantic import rewrite
from vriksha.semantic.cache import SemanticCache, scope_key
from vriksha.semantic.classify import Classified, RouteClassifier
from vriksha.semantic.config import Pool, RoutesConfig
from vriksha.semantic.decisions import Route
from vriksha.semantic.metrics import SemanticMetrics
from vriksha.semantic.signals import SignalValues
from vriksha.server.auth import APIKeyMiddleware
from vriksha.server.errors import ModelNotFoundError, ServerError, install_error_handlers
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger(__name__)

ROUTE_HEADER = "x-vriksha-route"  # pool=...; decision=...; reason=...
FALLTHROUGH_HEADER = "x-vriksha-fallthrough"  # the pools skipped for want of a live replica
CACHE_HEADER = "x-vriksha-cache"  # hit; similarity=0.97 | miss | skip


class BlockedError(ServerError, type="invalid_request_error", code="blocked_by_policy"):
    """A block decision refused the request, with the status the decision names."""

    def __init__(self, message: str, status: int, headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.status = status


@dataclass(slots=True)
class PoolRuntime:
    cfg: Pool
    pool: ReplicaPool
    forwarder: Forwarder
    tokens: PromptTokens
    served: str | None

    async def served_name(self, http: httpx.AsyncClient) -> str:
        if self.served is None:
            for r in self.pool.healthy():
                try:
                    models = (await http.get(f"{r.url}/v1/models", timeout=2)).json()["data"]
                    self.served = str(models[0]["id"])
                    break
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    continue
        return self.served or self.cfg.name


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


def _pool_router_config(p: Pool, base: RouterConfig) -> RouterConfig:
    specs = [ReplicaSpec(u.partition(",")[0].rstrip("/"), u.partition(",")[2] or None) for u in p.replicas]
    fields = {f: getattr(base, f) for f in base.__slots__ if f not in ("replicas", "policy", "model")}
    return RouterConfig(replicas=specs, policy=p.policy, model=p.tokenizer, **fields)


def create_semantic_app(
    cfg: RoutesConfig, classifier: RouteClassifier, base: RouterConfig | None = None
) -> FastAPI:
    base = base or RouterConfig()
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(base.request_timeout_s, connect=base.connect_timeout_s),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )
    tokenizers: dict[str | None, PromptTokens] = {}
    pools: dict[str, PoolRuntime] = {}
    for p in cfg.pools:
        pool = ReplicaPool(_pool_router_config(p, base), http)
        if p.tokenizer not in tokenizers:
            tokenizers[p.tokenizer] = PromptTokens.for_model(p.tokenizer)
        pools[p.name] = PoolRuntime(p, pool, Forwarder(pool, http), tokenizers[p.tokenizer], p.served_model)
    every = [r for rt in pools.values() for r in rt.pool.replicas]
    shared = RouterMetrics(lambda: every)  # one registry: replica URLs tell the pools apart
    for rt in pools.values():
        rt.pool.metrics = shared
    metrics = SemanticMetrics()
    for b in classifier.batchers:
        b.on_batch = lambda n, _s: metrics.batch_size.observe(n)
    cache = SemanticCache(cfg.cache) if cfg.cache.enabled else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for b in classifier.batchers:
            b.start()
        for rt in pools.values():
            await rt.pool.start()
        for rt in pools.values():
            await rt.served_name(http)
            logger.info(
                "pool %s: %d replicas, %d healthy", rt.cfg.name, len(rt.pool.replicas), len(rt.pool.healthy())
            )
        try:
            yield
        finally:
            for rt in pools.values():
                await rt.pool.stop()
                await rt.forwarder.aclose()
            for b in classifier.batchers:
                await b.stop()
            await http.aclose()

    app = FastAPI(title="vriksha semantic router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.pools = pools
    app.state.cache = cache
    install_error_handlers(app)

    async def handle(request: Request, path: str, model: type[BaseModel]) -> Response:
        arrived = time.perf_counter()
        raw = await request.body()
        req = _parse(model, raw)
        body = json.loads(raw)
        text = rewrite.routing_text(body)
        if req.model in pools:
            result = Classified(
                [Route("explicit", req.model, None, "the client named the pool")], SignalValues(), None
            )
        elif req.model == cfg.virtual_model:
            result = await classifier.classify(text)
            metrics.decide_seconds.observe(result.decide_s)
        else:
            names = [cfg.virtual_model, *pools]
            raise ModelNotFoundError(
                f"the model {req.model!r} does not exist here; ask for {cfg.virtual_model!r} to be routed or a "
                f"pool by name: {names} (see GET /v1/models)",
                param="model",
            )
        emb = result.emb
        if emb is not None:
            metrics.embed_seconds.observe(result.embed_s)
        skipped: list[str] = []
        i = 0
        while True:
            if i == len(result.routes):
                if result.complete:
                    break
                had = emb
                result = await classifier.complete(text, result, emb)  # the settled routes all fell through
                emb = result.emb
                if had is None:
                    metrics.embed_seconds.observe(result.embed_s)
            route = result.routes[i]
            i += 1
            if route.pool is None:
                metrics.blocked.labels(route.decision).inc()
                raise BlockedError(
                    route.block_message, route.block_status, {ROUTE_HEADER: route_header(route)}
                )
            rt = pools[route.pool]
            if not rt.pool.healthy():
                skipped.append(route.pool)
                metrics.fallthrough.labels(route.pool).inc()
                continue
            out = rewrite.apply(body, route.changes, await rt.served_name(http))
            headers = {ROUTE_HEADER: route_header(route)}
            if skipped:
                headers[FALLTHROUGH_HEADER] = _header_value(
                    ", ".join(f"{s} (no live replica)" for s in skipped)
                )
            scope = cache_emb = static_emb = pending_emb = None
            cacheable = cache is not None and bool(text) and not req.stream
            if cacheable and (cfg.cache.cache_sampled or not rewrite.sampled(out)):
                key = hashlib.sha256((presented_key(request) or "").encode()).hexdigest()
                scope = scope_key(key, route.pool, path, out, text)
                if classifier.cache_batcher is not None:  # static routing, transformer cache
                    static_emb = emb if emb is not None else (await classifier.embed(text))[0]
                floor = cfg.cache.prefilter
                if (
                    static_emb is not None
                    and floor is not None
                    and not cache.might_hit(scope, static_emb, floor)
                ):
                    # a miss by the cheap vectors: the cache's vector is computed while the pool answers
                    pending_emb = asyncio.ensure_future(classifier.cache_vector(text, emb))
                    found = None
                else:
                    cache_emb, embed_s, shared = await classifier.cache_vector(text, emb)
                    if embed_s:
                        metrics.embed_seconds.observe(embed_s)
                    if shared:
                        emb = cache_emb
                    found = cache.lookup(scope, cache_emb, text)
                if found is not None:
                    metrics.cache_hits.labels(route.pool).inc()
                    metrics.routes.labels(route.decision, route.pool).inc()
                    headers[CACHE_HEADER] = f"hit; similarity={found[1]:.3f}"
                    return Response(found[0], 200, media_type="application/json", headers=headers)
                metrics.cache_misses.labels(route.pool).inc()
                headers[CACHE_HEADER] = "miss"
            elif cache is not None:
                headers[CACHE_HEADER] = "skip"
            new_raw = json.dumps(out).encode()
            new_req = _parse(model, new_raw)
            tokenize = rt.tokens.chat if path.endswith("chat/completions") else rt.tokens.completion
            ids = await off_loop(len(new_raw), tokenize, new_req)  # a long prompt: tokenized on a thread
            try:
                resp = await rt.forwarder.forward(
                    request.headers, path, new_raw, ids, bool(req.stream), arrived
                )
            except NoReplicaError:
                if pending_emb is not None:
                    pending_emb.cancel()
                skipped.append(route.pool)
                metrics.fallthrough.labels(route.pool).inc()
                continue
            metrics.routes.labels(route.decision, route.pool).inc()
            if pending_emb is not None:  # computed during the forward: stored before the answer leaves
                cache_emb = (await pending_emb)[0]
            return _relabel(resp, route.pool, headers, cache, scope, (cache_emb, static_emb), text)
        raise NoReplicaError(
            f"no pool can take this request: {', '.join(skipped)} have no live replica; retry shortly",
            headers={"Retry-After": "1", FALLTHROUGH_HEADER: _header_value(", ".join(skipped))},
        )

    def _relabel(resp, pool, headers, cache, scope, vectors, text) -> Response:
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
            if scope is not None:
                cache.store(scope, vectors[0], text, content, prefilter_emb=vectors[1])
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length",)}
        out_headers.update(headers)
        return Response(content, resp.status_code, headers=out_headers)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await handle(request, "/v1/chat/completions", ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, "/v1/completions", CompletionRequest)

    @app.get("/v1/models")
    async def models() -> Response:
        now = int(time.time())
        ids = [cfg.virtual_model, *pools]
        data = [{"id": i, "object": "model", "created": now, "owned_by": "vriksha"} for i in ids]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        live = {name: len(rt.pool.healthy()) for name, rt in pools.items()}
        ok = any(live.values())
        return JSONResponse(
            {"status": "ok" if ok else "no_healthy_replica", "pools": live}, 200 if ok else 503
        )

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(shared.render() + metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/router/pools")
    async def pool_state() -> Response:
        out: dict[str, Any] = {}
        for name, rt in pools.items():
            reps = [{"url": r.url, "healthy": r.healthy, "in_flight": r.in_flight} for r in rt.pool.replicas]
            out[name] = {"policy": rt.pool.policy.name, "served_model": rt.served, "replicas": reps}
        return JSONResponse(
            {"virtual_model": cfg.virtual_model, "pools": out, "cache_entries": len(cache or ())}
        )

    if base.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=base.api_key, exempt=base.auth_exempt)
    return app


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
