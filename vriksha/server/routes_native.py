"""Native endpoints: /generate on token ids (for rollouts), /health, /metrics, /flush_cache, /start_profile,
/stop_profile."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.net.offload import body_size, off_loop
from vriksha.server.context import EnginePrompt, prompt_length
from vriksha.server.deltas import DeltaTracker
from vriksha.server.engine_client import RequestStream, merge, start_all
from vriksha.server.errors import BadRequestError, ConflictError, to_response
from vriksha.server.protocol import CloseSessionRequest, GenerateRequest, ProfileRequest
from vriksha.server.responses import GenerateOutput, GenerateResponse
from vriksha.server.sampling import check_prompt_logprobs, native_params
from vriksha.server.sessions import session_of
from vriksha.server.sse import DONE, error_event, event, sse_response, unless_disconnected
from vriksha.server.state import ServerState, StateDep

router = APIRouter()


def _top(c: CompletionOutput, start: int) -> list[list[tuple[int, float]]] | None:
    if c.logprobs is None:
        return None
    return [sorted(step.items(), key=lambda kv: kv[1], reverse=True) for step in c.logprobs[start:]]


def _output(c: CompletionOutput, with_text: bool, start: int = 0, text: str | None = None) -> GenerateOutput:
    """Choice `c` from token `start` on; `text`: its new text (default: all of it)."""
    return GenerateOutput(
        index=c.index,
        token_ids=list(c.token_ids[start:]),
        token_logprobs=list(c.token_logprobs[start:]),
        top_logprobs=_top(c, start),
        text=(c.text if text is None else text) if with_text else None,
        finish_reason=c.finish_reason,
    )


def _response(out: RequestOutput, with_text: bool) -> GenerateResponse:
    return GenerateResponse(
        request_id=out.request_id,
        prompt_tokens=len(out.prompt_token_ids),
        cached_tokens=out.num_cached_tokens,
        outputs=[_output(c, with_text) for c in out.outputs],
        finished=out.finished,
        meta=dict(out.metrics),
        weight_version=out.weight_version,
    )


def _prepare(req: GenerateRequest, state: ServerState) -> tuple[bool, list[EnginePrompt], SamplingParams]:
    """(a batch of prompts?, the prompts tokenized, the sampling parameters), off the event loop when large."""
    if (req.input_ids is None) == (req.text is None):
        raise BadRequestError("send exactly one of input_ids (token ids) or text", param="input_ids")
    params = native_params(req.sampling_params)
    batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
    prompts: list[Any] = (
        list(req.input_ids) if batch else [req.input_ids if req.input_ids is not None else req.text]
    )
    if not prompts or any(len(p) == 0 for p in prompts):
        raise BadRequestError("the prompt is empty; send at least one token id", param="input_ids")
    if batch and req.stream:
        raise BadRequestError(
            "stream=true takes a single prompt; send input_ids as one list of token ids", param="stream"
        )
    state.admission.check_size(len(prompts) * params.n, len(prompts), params.n)
    tokenized = [state.encoder.engine_prompt(p) for p in prompts]
    lengths = [prompt_length(state.tokenizer, p) for p in tokenized]
    check_prompt_logprobs(params, lengths, 1, state.config.max_prompt_logprobs)
    return batch, tokenized, params


@router.post("/generate")
async def generate(req: GenerateRequest, request: Request, state: StateDep) -> Response:
    batch, prompts, params = await off_loop(body_size(request.headers), _prepare, req, state)
    rids = [
        req.request_id if not batch or req.request_id is None else f"{req.request_id}-{i}"
        for i in range(len(prompts))
    ]
    session = session_of(req.session_id, request)
    streams = await state.client.open_all(prompts, params, "generate", rids, session_id=session)
    await unless_disconnected(request, start_all(streams), state.drain)
    if req.stream:
        return sse_response(_stream(streams[0], req.return_text), streams, state.drain)

    async def finals() -> list[RequestOutput]:
        result: list[RequestOutput | None] = [None] * len(streams)
        async for i, out in merge(streams):
            result[i] = out
        return [r for r in result if r is not None]

    outs = await unless_disconnected(request, finals(), state.drain)
    bodies = [_response(o, req.return_text).model_dump() for o in outs]
    return JSONResponse(bodies if batch else bodies[0])


async def _stream(stream: RequestStream, with_text: bool) -> AsyncIterator[bytes]:
    tracker = DeltaTracker()
    try:
        async for out in stream:
            outputs = []
            for c in out.outputs:
                d = tracker.advance(c.index, c)
                if d is not None:
                    outputs.append(_output(c, with_text, d.token_start, d.text).model_dump())
            if outputs or out.finished:
                yield event(
                    {
                        "request_id": out.request_id,
                        "prompt_tokens": len(out.prompt_token_ids),
                        "cached_tokens": out.num_cached_tokens,
                        "outputs": outputs,
                        "finished": out.finished,
                        "weight_version": out.weight_version,
                    }
                )
    except Exception as exc:
        resp = to_response(exc)
        yield error_event(str(exc), "server_error" if resp.status_code >= 500 else "invalid_request_error")
    yield DONE


@router.get("/health")
async def health(state: StateDep) -> Response:
    if state.drain.draining:
        body = {"status": "draining", "in_flight": state.admission.in_flight}
        remaining = state.drain.remaining_s()
        if remaining is not None:
            body["drain_remaining_s"] = round(remaining, 1)
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ok", "model": state.model_name})


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.post("/flush_cache")
async def flush_cache(state: StateDep) -> Response:
    if not await state.engine.flush_cache():
        raise ConflictError("the prefix cache was not flushed because requests are running; retry when idle")
    return JSONResponse({"flushed": True})


@router.post("/close_session")
async def close_session(request: Request, state: StateDep) -> Response:
    """Close a session (its pinned K/V becomes ordinary cache): `{"session_id": ...}` or the x-session-id header."""
    raw = await request.body()
    try:
        body = CloseSessionRequest.model_validate_json(raw) if raw.strip() else None
    except ValidationError as exc:
        raise BadRequestError(
            f"bad close_session body: {exc.errors()[0]['msg']}", param="session_id"
        ) from exc
    session = session_of(body.session_id if body is not None else None, request)
    if session is None:
        raise BadRequestError(
            'name the session: send {"session_id": ...} or the x-session-id header', param="session_id"
        )
    close = getattr(state.engine, "close_session", None)
    closed = bool(await close(session)) if close is not None else False
    return JSONResponse({"session_id": session, "closed": closed})


@router.post("/start_profile")
async def start_profile(request: Request, state: StateDep) -> Response:
    raw = await request.body()
    try:
        opts = ProfileRequest.model_validate_json(raw) if raw.strip() else ProfileRequest()
    except ValidationError as exc:
        raise BadRequestError(
            f"invalid /start_profile body: {exc.errors()[0]['msg']}; send {{}} or "
            '{"record_shapes": bool, "profile_memory": bool, "with_stack": bool}'
        ) from exc
    directory = state.profiler.start(opts.record_shapes, opts.profile_memory, opts.with_stack)
    return JSONResponse({"profiling": True, "dir": str(directory)})


@router.post("/stop_profile")
async def stop_profile(state: StateDep) -> Response:
    path = await state.profiler.stop()
    return JSONResponse({"profiling": False, "traces": [str(path)]})
