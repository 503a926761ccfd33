"""The semantic front: OpenAI endpoints that pick a pool (signals, decisions, the semantic cache) and then
hand the request to that pool's router (replica choice, retries, streaming), all in one process. The routes
are an `APIRouter` over the app's `SemanticState` (`state.py`); one request's way is `routing.py`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from vriksha.router.config import RouterConfig
from vriksha.router.semantic.classify import RouteClassifier
from vriksha.router.semantic.config import RoutesConfig
from vriksha.router.semantic.routing import SemanticRouting
from vriksha.router.semantic.state import SemanticState, State
from vriksha.server.auth import APIKeyMiddleware
from vriksha.server.errors import install_error_handlers
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request, state: State) -> Response:
    return await SemanticRouting(state, request, "/v1/chat/completions", ChatCompletionRequest).answer()


@router.post("/v1/completions")
async def completions(request: Request, state: State) -> Response:
    return await SemanticRouting(state, request, "/v1/completions", CompletionRequest).answer()


@router.get("/v1/models")
async def models(state: State) -> Response:
    now = int(time.time())
    ids = [state.cfg.virtual_model, *state.pools]
    data = [{"id": i, "object": "model", "created": now, "owned_by": "vriksha"} for i in ids]
    return JSONResponse({"object": "list", "data": data})


@router.get("/health")
async def health(state: State) -> Response:
    live = {name: len(rt.pool.healthy()) for name, rt in state.pools.items()}
    ok = any(live.values())
    return JSONResponse({"status": "ok" if ok else "no_healthy_replica", "pools": live}, 200 if ok else 503)


@router.get("/metrics")
async def metrics_endpoint(state: State) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(state.replica_metrics.render() + state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/router/pools")
async def pool_state(state: State) -> Response:
    out: dict[str, Any] = {}
    for name, rt in state.pools.items():
        reps = [{"url": r.url, "healthy": r.healthy, "in_flight": r.in_flight} for r in rt.pool.replicas]
        out[name] = {"policy": rt.pool.policy.name, "served_model": rt.served, "replicas": reps}
    entries = len(state.cache or ())
    return JSONResponse({"virtual_model": state.cfg.virtual_model, "pools": out, "cache_entries": entries})


def create_semantic_app(
    cfg: RoutesConfig, classifier: RouteClassifier, base: RouterConfig | None = None
) -> FastAPI:
    base = base or RouterConfig()
    state = SemanticState.build(cfg, classifier, base)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await _start(state)
        try:
            yield
        finally:
            await _stop(state)

    app = FastAPI(title="vriksha semantic router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.semantic = state
    app.state.pools = state.pools
    app.state.cache = state.cache
    install_error_handlers(app)
    app.include_router(router)
    if base.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=base.api_key, exempt=base.auth_exempt)
    return app


async def _start(state: SemanticState) -> None:
    for b in state.classifier.batchers:
        b.start()
    for rt in state.pools.values():
        await rt.pool.start()
    for rt in state.pools.values():
        await rt.served_name(state.http)
        logger.info(
            "pool %s: %d replicas, %d healthy", rt.cfg.name, len(rt.pool.replicas), len(rt.pool.healthy())
        )


async def _stop(state: SemanticState) -> None:
    for rt in state.pools.values():
        await rt.pool.stop()
        await rt.forwarder.aclose()
    for b in state.classifier.batchers:
        await b.stop()
    await state.http.aclose()
