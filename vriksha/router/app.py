"""The router's FastAPI app: the endpoints of `vriksha serve`, each parsed and validated as a replica would,
tokenized for the policy, then forwarded (the hot paths, `fast_path.py`); plus its own endpoints (/health,
/metrics, /router/replicas, /router/mirror), an `APIRouter` over the app's `RouterState` through `Depends`."""

from __future__ import annotations

import gc
import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers

from vriksha.net.offload import off_loop
from vriksha.net.trust import INTERNAL_HEADER
from vriksha.router import passthrough
from vriksha.router.config import RouterConfig
from vriksha.router.fast_path import Handler, HotPathApp
from vriksha.router.pool import ReplicaPool
from vriksha.router.proxy import Forwarder, NoReplicaError
from vriksha.router.tokens import PromptTokens
from vriksha.server.auth import APIKeyMiddleware
from vriksha.server.errors import AuthenticationError, BadRequestError, install_error_handlers
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from vriksha.server.protocol_responses import ResponsesRequest

logger = logging.getLogger(__name__)


def parse_request(model: type[BaseModel], body: bytes) -> Any:
    """A request body as a replica would parse it: the same validation errors, the same 422."""
    if not body.strip():
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:  # as FastAPI parses a replica's body, so the error reads the same
        err = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**err, "ctx": {"error": exc.msg}}]) from exc
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc


class InternalOnlyError(AuthenticationError, status=403, code="internal_only"):
    """A router endpoint for holders of the internal key, asked without it."""


@dataclass(slots=True)
class RouterState:
    """What the router's own endpoints read, handed to them through `Depends`."""

    config: RouterConfig
    pool: ReplicaPool


def router_state(request: Request) -> RouterState:
    return request.app.state.router


State = Annotated[RouterState, Depends(router_state)]
router = APIRouter()


@router.get("/health")
async def health(state: State) -> Response:
    healthy = state.pool.healthy()
    ok = bool(healthy)
    body = {"status": "ok" if ok else "no_healthy_replica", "healthy": len(healthy)}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(state.pool.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _replica_view(r: Any) -> dict[str, Any]:
    ev = r.events
    events = (
        None
        if ev is None
        else {"synced": ev.synced, "instance": ev.instance, "seq": ev.seq, "tokens": ev.tree.size}
    )
    return {
        "url": r.url,
        "role": r.spec.role,
        "healthy": r.healthy,
        "in_flight": r.in_flight,
        "queue": r.queue,
        "kv_usage": r.load.kv_usage,
        "events": events,
    }


@router.get("/router/replicas")
async def replicas(state: State) -> Response:
    return JSONResponse(
        {"policy": state.pool.policy.name, "replicas": [_replica_view(r) for r in state.pool.replicas]}
    )


@router.get("/router/mirror")
async def mirror(replica: int, request: Request, state: State) -> Response:
    """A replica's mirrored tree as leaf paths (for tests and debugging): the cached prompts of every client,
    so for holders of the internal key only, never a client's API key."""
    given, key, pool = request.headers.get(INTERNAL_HEADER, ""), state.config.internal_key, state.pool
    if not key or not hmac.compare_digest(given.encode(), key.encode()):
        raise InternalOnlyError(
            f"/router/mirror shows every client's cached prompts: send the internal key in `{INTERNAL_HEADER}`"
        )
    if not 0 <= replica < len(pool.replicas):
        raise BadRequestError(
            f"replica must be in 0..{len(pool.replicas) - 1}, got {replica}", param="replica"
        )
    r = pool.replicas[replica]
    if r.events is None:
        raise NoReplicaError("this replica has no event stream (--replica URL,EVENTS)")
    return JSONResponse({"seq": r.events.seq, "paths": sorted(list(p) for p in r.events.tree.paths())})


def create_router_app(config: RouterConfig, tokens: PromptTokens | None = None) -> FastAPI:
    tokens = tokens or PromptTokens.for_model(config.model)
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )
    pool = ReplicaPool(config, http)
    forwarder = Forwarder(pool, http)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        logger.info(
            "routing over %d replicas with the %s policy: %s",
            len(pool.replicas),
            pool.policy.name,
            ", ".join(f"{r.url} ({r.spec.role})" for r in pool.replicas),
        )
        # what is alive now (modules, the tokenizer: ~350k objects) lives as long as the router: out of the
        # collector's full passes, each of which would otherwise stall every request for tens of ms
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await pool.stop()
            await forwarder.aclose()
            await http.aclose()

    app = HotPathApp(title="vriksha router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.pool = pool
    install_error_handlers(app)

    def endpoint(path: str, model: type[BaseModel], ids) -> Handler:
        def parsed(body: bytes) -> tuple[Any, list[int]]:
            req = parse_request(model, body)
            return req, ids(req)

        async def serve(headers: Headers, body: bytes, arrived: float) -> Response:
            req, prompt_ids = await off_loop(len(body), parsed, body)  # a large prompt: tokenized on a thread
            lora = pool.adapter_of(getattr(req, "model", None))
            session = getattr(req, "session_id", None)
            return await forwarder.forward(
                headers, path, body, prompt_ids, bool(req.stream), arrived, lora, session
            )

        return serve

    hot = {
        "/v1/completions": endpoint("/v1/completions", CompletionRequest, tokens.completion),
        "/v1/chat/completions": endpoint("/v1/chat/completions", ChatCompletionRequest, tokens.chat),
        "/generate": endpoint("/generate", GenerateRequest, tokens.generate),
        "/v1/responses": endpoint("/v1/responses", ResponsesRequest, tokens.responses),
    }
    key = config.api_key
    app.hot_paths(hot, wrap=(lambda inner: APIKeyMiddleware(inner, key, config.auth_exempt)) if key else None)

    passthrough.install(app, pool, http)
    app.state.router = RouterState(config, pool)
    app.include_router(router)

    if config.api_key:
        # /router/mirror takes the internal key instead (checked above), never a client's
        exempt = config.auth_exempt | {"/router/mirror"}
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key, exempt=exempt)
    return app
