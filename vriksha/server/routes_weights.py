"""Weight-update endpoints, named as vLLM's weight transfer and TRL's server mode name them.

POST /init_weight_transfer_engine (alias /init_communicator), /start_weight_update, /update_weights,
/finish_weight_update, /close_communicator; POST /pause and /resume (aliases /pause_generation,
/resume_generation); POST /reset_prefix_cache; GET /weight_version, /weight_specs, /weight_digests.

An update waits until the engine is idle (generation is paused while it runs), so a request is computed
under one weight version from its first token to its last, and the prefix cache is flushed when a new
version takes effect.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from vriksha.server.errors import ConflictError, ServerOverloadedError, to_response
from vriksha.server.state import StateDep
from vriksha.weights.node import node_identity
from vriksha.weights.plan import TensorSpec
from vriksha.weights.receiver import WeightClientConflict, WeightUpdater, engine_parameters, parameter_digests

logger = logging.getLogger(__name__)

router = APIRouter()
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
PAUSED_WAIT_S = 600.0


class InitRequest(BaseModel):
    client_id: str = Field(..., min_length=1, description="the trainer's identity (one run, one id)")
    backend: Literal["shm", "gloo", "fs"]
    init_info: dict[str, Any] = Field(default_factory=dict)


class StartRequest(BaseModel):
    client_id: str
    version: int = Field(..., ge=0)
    wait_s: float = Field(60.0, ge=0.0, description="how long running requests may take to finish first")


class UpdateRequest(BaseModel):
    client_id: str
    update_info: dict[str, Any]


class ClientRequest(BaseModel):
    client_id: str


class WeightControl:
    """The updater plus the pause gate in front of the generation endpoints."""

    def __init__(self, allow_multiple_clients: bool) -> None:
        self.updater = WeightUpdater(allow_multiple_clients)
        self.lock = asyncio.Lock()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.paused_by_update = False

    def pause(self) -> None:
        self.resumed.clear()

    def resume(self) -> None:
        self.resumed.set()


def _control(request: Request) -> WeightControl:
    return request.app.state.weights


def _conflict(exc: WeightClientConflict) -> ConflictError:
    return ConflictError(str(exc))


def _owned_control(request: Request, client_id: str) -> WeightControl:
    """The control, after checking that `client_id` holds the transfer (a 409 otherwise)."""
    ctl = _control(request)
    try:
        ctl.updater.check_owner(client_id)
    except WeightClientConflict as exc:
        raise _conflict(exc) from None
    return ctl


async def _wait_idle(state: Any, wait_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        stats = state.engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return
        if loop.time() >= deadline:
            raise ConflictError(
                f"{stats.num_running + stats.num_waiting} requests are still running after {wait_s} s; "
                "retry the weight update, or raise wait_s"
            )
        await asyncio.sleep(0.02)


@router.post("/init_weight_transfer_engine")
@router.post("/init_communicator")
async def init_transfer(body: InitRequest, request: Request, state: StateDep) -> Response:
    ctl = _control(request)
    async with ctl.lock:
        try:
            ctl.updater.claim(body.client_id)
        except WeightClientConflict as exc:
            raise _conflict(exc) from None
        # building a gloo group blocks until the trainer joins: off the event loop, in the engine thread
        await state.engine.call(lambda _e: ctl.updater.init_backend(body.backend, body.init_info))
    logger.info("weight transfer from %s over %s", body.client_id, body.backend)
    return JSONResponse({"backend": body.backend, "version": state.engine.engine.weight_version})


@router.post("/start_weight_update")
async def start_update(body: StartRequest, request: Request, state: StateDep) -> Response:
    ctl = _owned_control(request, body.client_id)
    if ctl.resumed.is_set():
        ctl.pause()
        ctl.paused_by_update = True
    try:
        await _wait_idle(state, body.wait_s)
        ctl.updater.start(body.version)
    except BaseException:
        _resume_after_update(ctl)
        raise
    return JSONResponse({"updating": True, "version": body.version})


@router.post("/update_weights")
async def update_weights(body: UpdateRequest, request: Request, state: StateDep) -> Response:
    ctl = _owned_control(request, body.client_id)
    counts = await state.engine.call(lambda e: ctl.updater.update(e, body.update_info))
    return JSONResponse({"receiver": counts})


@router.post("/finish_weight_update")
async def finish_update(body: ClientRequest, request: Request, state: StateDep) -> Response:
    ctl = _owned_control(request, body.client_id)
    try:
        result = await state.engine.call(ctl.updater.finish)
    finally:
        _resume_after_update(ctl)
    return JSONResponse(result)


def _resume_after_update(ctl: WeightControl) -> None:
    ctl.updater.abort()
    if ctl.paused_by_update:
        ctl.paused_by_update = False
        ctl.resume()


@router.post("/close_communicator")
async def close_transfer(body: ClientRequest, request: Request, state: StateDep) -> Response:
    ctl = _owned_control(request, body.client_id)
    await state.engine.call(lambda _e: ctl.updater.release())
    _resume_after_update(ctl)
    return JSONResponse({"closed": True})


@router.post("/pause")
@router.post("/pause_generation")
async def pause(request: Request) -> Response:
    ctl = _control(request)
    ctl.pause()
    ctl.paused_by_update = False
    return JSONResponse({"paused": True})


@router.post("/resume")
@router.post("/resume_generation")
async def resume(request: Request) -> Response:
    _control(request).resume()
    return JSONResponse({"paused": False})


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(state: StateDep) -> Response:
    if not await state.engine.flush_cache():
        raise ConflictError(
            "the prefix cache was not fully reset because requests are running; retry when idle"
        )
    return JSONResponse({"reset": True})


@router.get("/weight_version")
async def weight_version(request: Request, state: StateDep) -> Response:
    ctl = _control(request)
    s = ctl.updater.state
    return JSONResponse(
        {
            "version": state.engine.engine.weight_version,
            "owner": s.owner,
            "backend": s.backend,
            "updating": s.updating,
            "paused": not ctl.resumed.is_set(),
            "node": node_identity().to_json(),  # the trainer picks shared memory only on the same node
        }
    )


@router.get("/weight_specs")
async def weight_specs(state: StateDep) -> Response:
    params = await state.engine.call(lambda e: engine_parameters(e.model))
    return JSONResponse([TensorSpec.of(n, t).to_json() for n, t in params.items()])


@router.get("/weight_digests")
async def weight_digests(state: StateDep) -> Response:
    return JSONResponse(await state.engine.call(parameter_digests))


def install(app: FastAPI, allow_multiple_clients: bool = False) -> None:
    """Add the weight endpoints and hold generation requests while generation is paused."""
    app.state.weights = ctl = WeightControl(allow_multiple_clients)
    app.include_router(router)

    @app.middleware("http")
    async def _pause_gate(request: Request, call_next: Any) -> Response:
        if not ctl.resumed.is_set() and request.url.path in GENERATION_PATHS:
            try:
                await asyncio.wait_for(ctl.resumed.wait(), PAUSED_WAIT_S)
            except TimeoutError:
                return to_response(
                    ServerOverloadedError(
                        f"generation has been paused for {PAUSED_WAIT_S:.0f} s (a weight update); retry later"
                    )
                )
        return await call_next(request)
