"""Weight-update endpoints, named as vLLM's weight transfer and TRL's server mode name them.

POST /init_weight_transfer_engine (alias /init_communicator), /start_weight_update, /update_weights,
/finish_weight_update, /close_communicator; POST /pause and /resume (aliases /pause_generation,
/resume_generation); POST /reset_prefix_cache; GET /weight_version, /weight_specs, /weight_digests.

An update waits until the engine is idle (generation is paused while it runs), so a request is computed
under one weight version from its first token to its last, and the prefix cache is flushed when a new
version takes effect. Every endpoint here takes the weights key (server/auth.py; `/weight_version` also the
API key, without the owner), and every call of a transfer after its init presents the token the init
answered. A refused or failed update answers 400 `weight_update_failed` (409 for a conflict), is rolled
back whole, and generation resumes under the old version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from vriksha.server.auth import WEIGHTS
from vriksha.server.errors import ConflictError, ServerError, ServerOverloadedError, to_response
from vriksha.server.state import StateDep
from vriksha.weights.node import node_identity
from vriksha.weights.plan import TensorSpec, WeightTransferError
from vriksha.weights.receiver import WeightClientConflict, WeightUpdater, engine_parameters, parameter_digests

logger = logging.getLogger(__name__)

router = APIRouter()
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
PAUSED_WAIT_S = 600.0


class InitRequest(BaseModel):
    client_id: str = Field(..., min_length=1, description="the trainer's identity (one run, one id)")
    backend: Literal["shm", "gloo", "fs"]
    init_info: dict[str, Any] = Field(default_factory=dict)


class TransferRequest(BaseModel):
    client_id: str
    token: str = Field(
        ..., min_length=1, description="the transfer token /init_weight_transfer_engine answered"
    )


class StartRequest(TransferRequest):
    version: int = Field(..., ge=0)
    wait_s: float = Field(60.0, ge=0.0, description="how long running requests may take to finish first")
    timeout_s: float = Field(
        600.0, gt=0.0, description="an update not finished within this is rolled back and generation resumes"
    )
    rewind: bool = Field(
        False, description="allow a version behind the served one (older weights on purpose)"
    )
    adapter: dict[str, Any] | None = Field(
        None,
        description="an adapter-only update: the LoRA adapter it carries {name, rank, alpha, modules, "
        "target_modules, use_rslora}; its tensors are named by PEFT's keys",
    )


class UpdateRequest(TransferRequest):
    update_info: dict[str, Any]


class WeightUpdateFailedError(
    ServerError, status=400, type="invalid_request_error", code="weight_update_failed"
):
    """An update was refused or failed (mismatched tensors, a torn buffer, a dead peer); nothing was applied."""


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """The updater's errors as HTTP answers: a conflict 409, a refused or failed update 400."""
    try:
        yield
    except WeightClientConflict as exc:
        raise ConflictError(str(exc)) from None
    except WeightTransferError as exc:
        raise WeightUpdateFailedError(str(exc)) from None


class WeightControl:
    """The updater plus the pause gate in front of the generation endpoints."""

    def __init__(self, allow_multiple_clients: bool) -> None:
        self.updater = WeightUpdater(allow_multiple_clients)
        self.lock = asyncio.Lock()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.paused_by_update = False
        self._expiry: asyncio.TimerHandle | None = None

    def pause(self) -> None:
        self.resumed.clear()

    def resume(self) -> None:
        self.resumed.set()

    def end_update(self, token: str | None = None) -> None:
        """Roll back the update in progress (only `token`'s, when given) and, once none is left, resume the
        generation it paused."""
        self.updater.abort(token)
        if self.updater.state.update is None:
            if self._expiry is not None:
                self._expiry.cancel()
                self._expiry = None
            if self.paused_by_update:
                self.paused_by_update = False
                self.resume()

    def expire_after(self, seconds: float) -> None:
        """Roll back the update now in progress if it has not finished within `seconds` (a trainer that died
        mid-update must not hold generation paused)."""
        if self._expiry is not None:
            self._expiry.cancel()
        update = self.updater.state.update

        def expire() -> None:
            if update is not None and self.updater.state.update is update:
                logger.warning(
                    "weight update to version %d abandoned after %g s: rolled back", update.version, seconds
                )
                self.end_update(update.token)

        self._expiry = asyncio.get_running_loop().call_later(seconds, expire)


def _control(request: Request) -> WeightControl:
    return request.app.state.weights


def _transfer(request: Request, body: TransferRequest) -> WeightControl:
    """The control, after checking that `body.token` is `body.client_id`'s transfer (a 409 otherwise)."""
    ctl = _control(request)
    with _errors():
        ctl.updater.transfer(body.client_id, body.token)
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
        with _errors():
            token = ctl.updater.claim(body.client_id)
        ctl.end_update()  # a replaced transfer's unfinished update is gone: resume what it paused
        try:
            # building a gloo group blocks until the trainer joins: off the event loop, in the engine thread
            with _errors():
                await state.engine.call(lambda _e: ctl.updater.init_backend(body.backend, body.init_info))
        except BaseException:
            ctl.updater.release(token, close=False)  # the failed init left no data plane to close
            raise
    logger.info("weight transfer from %s over %s", body.client_id, body.backend)
    return JSONResponse(
        {"backend": body.backend, "version": state.engine.engine.weight_version, "token": token}
    )


@router.post("/start_weight_update")
async def start_update(body: StartRequest, request: Request, state: StateDep) -> Response:
    ctl = _transfer(request, body)
    with _errors():
        ctl.updater.start(
            body.token, body.version, state.engine.engine.weight_version, body.rewind, body.adapter
        )
    if ctl.resumed.is_set():
        ctl.pause()
        ctl.paused_by_update = True
    ctl.expire_after(body.timeout_s)
    try:
        await _wait_idle(state, body.wait_s)
    except BaseException:
        ctl.end_update(body.token)
        raise
    return JSONResponse({"updating": True, "version": body.version})


@router.post("/update_weights")
async def update_weights(body: UpdateRequest, request: Request, state: StateDep) -> Response:
    ctl = _transfer(request, body)
    try:
        with _errors():
            counts = await state.engine.call(lambda e: ctl.updater.update(e, body.token, body.update_info))
    except BaseException:
        ctl.end_update(body.token)  # a failed push is rolled back whole, and generation resumes
        raise
    return JSONResponse({"receiver": counts})


@router.post("/finish_weight_update")
async def finish_update(body: TransferRequest, request: Request, state: StateDep) -> Response:
    ctl = _transfer(request, body)
    try:
        with _errors():
            result = await state.engine.call(lambda e: ctl.updater.finish(e, body.token))
    finally:
        ctl.end_update(body.token)
    return JSONResponse(result)


@router.post("/close_communicator")
async def close_transfer(body: TransferRequest, request: Request, state: StateDep) -> Response:
    ctl = _transfer(request, body)
    await state.engine.call(lambda _e: ctl.updater.release(body.token))
    ctl.end_update(body.token)
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
    ctl = _control(request)
    if ctl.updater.state.update is not None:
        raise ConflictError(
            f"a weight update of client {ctl.updater.state.owner!r} is in progress; generation resumes when it "
            "finishes, fails, is closed or times out"
        )
    ctl.resume()
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
    body = {
        "version": state.engine.engine.weight_version,
        "backend": s.backend,
        "updating": s.updating,
        "paused": not ctl.resumed.is_set(),
        "node": node_identity().to_json(),  # the trainer picks shared memory only on the same node
    }
    if getattr(request.state, "auth_role", None) == WEIGHTS:  # who trains is for trainers to know
        body["owner"] = s.owner
    return JSONResponse(body)


@router.get("/weight_specs")
async def weight_specs(state: StateDep) -> Response:
    params = await state.engine.call(lambda e: engine_parameters(e.model))
    return JSONResponse([TensorSpec.of(n, t).to_json() for n, t in params.items()])


@router.get("/weight_digests")
async def weight_digests(request: Request, state: StateDep) -> Response:
    adapters = _control(request).updater.adapters
    return JSONResponse(await state.engine.call(lambda e: parameter_digests(e, adapters)))


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
