"""The FastAPI app: engine lifecycle, routes, error mapping, auth."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from vriksha.engine.core.protocol import EngineProtocol
from vriksha.server.admission import Admission
from vriksha.server.auth import AccessPolicy, RoleMiddleware
from vriksha.server.config import ServerConfig
from vriksha.server.drain import Drain
from vriksha.server.engine_client import EngineClient
from vriksha.server.errors import install_error_handlers
from vriksha.server.metrics import ServerMetrics
from vriksha.server.metrics_vllm import install_vllm_metrics
from vriksha.server.profiler import ServerProfiler
from vriksha.server.routes_fleet import router as fleet_router
from vriksha.server.routes_info import router as info_router
from vriksha.server.routes_kv import router as kv_router
from vriksha.server.routes_lora import router as lora_router
from vriksha.server.routes_native import router as native_router
from vriksha.server.routes_openai import router as openai_router
from vriksha.server.routes_render import router as render_router
from vriksha.server.routes_responses import router as responses_router
from vriksha.server.routes_tokenize import router as tokenize_router
from vriksha.server.routes_weights import install as install_weight_routes
from vriksha.server.state import ServerState

logger = logging.getLogger(__name__)


def create_app(
    engine: EngineProtocol, config: ServerConfig | None = None, kv_events: Any = None, kv_roles: Any = None
) -> FastAPI:
    """An app serving `engine` (an `AsyncEngine`, or anything else of the `EngineProtocol`); the engine is
    started and shut down with the app. `kv_events` (a `KVEventPublisher` subscribed to the engine's cache)
    enables /kv_events/snapshot; `kv_roles` (a `KVRoles`) the prefill/decode transfer endpoints under /kv."""
    config = config or ServerConfig()
    admission = Admission(config.max_waiting, config.retry_after_s)
    metrics = ServerMetrics(engine.stats, lambda: admission.waiting, lambda: admission.in_flight)
    state = ServerState(
        engine=engine,
        config=config,
        admission=admission,
        metrics=metrics,
        client=EngineClient(engine, metrics, admission),
        profiler=ServerProfiler(config.profile_dir),
        drain=Drain(admission, config.shutdown_timeout_s),
    )
    install_vllm_metrics(
        metrics, engine.stats, lambda: state.model_name
    )  # llm-d's endpoint picker reads them

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            await engine.start()
        except Exception as exc:
            app.state.startup_error = exc
            raise
        logger.info("serving %s (max context %d tokens)", state.model_name, state.max_model_len)
        try:
            yield
        finally:
            admission.draining = True
            if kv_roles is not None:
                await kv_roles.close()
            if state.profiler.running:
                await state.profiler.stop()
            await engine.shutdown(config.shutdown_timeout_s)
            logger.info("engine shut down")

    app = FastAPI(title="vriksha", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.vriksha = state
    app.state.startup_error = None
    app.state.kv_events = kv_events
    app.state.kv_roles = kv_roles
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(native_router)
    install_weight_routes(app, config.allow_multiple_weight_clients)
    app.include_router(fleet_router)
    app.include_router(kv_router)
    app.include_router(lora_router)
    app.include_router(render_router)
    app.include_router(tokenize_router)
    app.include_router(info_router)
    policy = AccessPolicy(config.api_key, config.internal_key, config.weights_key, config.auth_exempt)
    app.add_middleware(RoleMiddleware, policy=policy)
    return app
