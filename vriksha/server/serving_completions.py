"""POST /v1/completions: one engine request per prompt, `n` choices each, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.net.offload import body_size, off_loop
from vriksha.profiling import phase
from vriksha.server.context import EnginePrompt, prompt_length
from vriksha.server.deltas import DeltaTracker
from vriksha.server.engine_client import RequestStream, merge, start_all
from vriksha.server.errors import BadRequestError, to_response
from vriksha.server.logprobs import completion_logprobs, prompt_completion_logprobs, vllm_prompt_logprobs
from vriksha.server.prompts import completion_prompts
from vriksha.server.protocol import CompletionRequest
from vriksha.server.responses import CompletionChoice, CompletionResponse, Usage, new_id, now
from vriksha.server.sampling import check_prompt_logprobs, completion_params, echo_only
from vriksha.server.sessions import session_of
from vriksha.server.sse import DONE, error_event, event, sse_response, unless_disconnected
from vriksha.server.state import ServerState


def _usage(finals: list[RequestOutput], prompt_only: bool = False) -> Usage:
    return Usage.of(
        sum(len(o.prompt_token_ids) for o in finals),
        0 if prompt_only else sum(len(c.token_ids) for o in finals for c in o.outputs),
        sum(o.num_cached_tokens for o in finals),
    )


def _without_completion(c: CompletionOutput) -> CompletionOutput:
    """A choice of an `echo` request with `max_tokens: 0`: its prompt alone (finished: "length", as OpenAI)."""
    return replace(
        c,
        text="",
        token_ids=[],
        token_logprobs=[],
        logprobs=[] if c.logprobs is not None else None,
        finish_reason="length" if c.finished else None,
    )


def _prepare(req: CompletionRequest, state: ServerState) -> tuple[list[EnginePrompt], SamplingParams]:
    """The request's prompts, tokenized, and its sampling parameters (off the event loop when large)."""
    with phase("server.parse"):
        prompts = completion_prompts(req)
        params = completion_params(req)
        if req.stream and req.echo and req.logprobs is not None:
            raise BadRequestError(
                "echo with logprobs is answered whole; send stream=false for the prompt's log-probabilities",
                param="echo",
            )
        state.admission.check_size(len(prompts) * params.n, len(prompts), params.n)
        tokenized = [state.encoder.engine_prompt(p) for p in prompts]
        lengths = [prompt_length(state.tokenizer, p) for p in tokenized]
        check_prompt_logprobs(params, lengths, params.n, state.config.max_prompt_logprobs)
    return tokenized, params


async def create_completion(req: CompletionRequest, state: ServerState, request: Request) -> Response:
    model = state.check_model(req.model)
    lora = state.lora_of(model)
    prompts, params = await off_loop(body_size(request.headers), _prepare, req, state)
    session = session_of(req.session_id, request)
    streams = await state.client.open_all(prompts, params, "completions", lora=lora, session_id=session)
    await unless_disconnected(request, start_all(streams), state.drain)
    if req.stream:
        return sse_response(_stream(req, state, model, streams), streams, state.drain)
    finals = await unless_disconnected(request, _finals(streams), state.drain)
    # prompt log-probabilities make a large body: built off the event loop
    size = None if params.prompt_logprobs is not None else 0
    return await off_loop(size, lambda: JSONResponse(_response(req, state, model, finals).model_dump()))


async def _finals(streams: list[RequestStream]) -> list[RequestOutput]:
    finals: list[RequestOutput | None] = [None] * len(streams)
    async for i, out in merge(streams):
        finals[i] = out
    return [f for f in finals if f is not None]


def _choice_logprobs(state: ServerState, c: CompletionOutput, k: int | None, start: int = 0, offset: int = 0):
    if k is None:
        return None
    return completion_logprobs(
        state.text_of,
        c.token_ids[start:],
        c.token_logprobs[start:],
        (c.logprobs or [])[start:] if c.logprobs else None,
        k,
        offset,
    )


def _response(
    req: CompletionRequest, state: ServerState, model: str, finals: list[RequestOutput]
) -> CompletionResponse:
    n = req.n or 1
    prompt_only = echo_only(req)
    choices = []
    for i, out in enumerate(finals):
        prompt_logprobs = (  # one list, shared by the prompt's choices
            vllm_prompt_logprobs(state.text_of, out.prompt_token_ids, out.prompt_logprobs)
            if req.prompt_logprobs is not None
            else None
        )
        for c in out.outputs:
            if prompt_only:
                c = _without_completion(c)
            prefix = ""
            if req.echo:
                prefix = (
                    out.prompt if out.prompt is not None else state.tokenizer.decode(out.prompt_token_ids)
                )
            logprobs = _choice_logprobs(state, c, req.logprobs, 0, len(prefix))
            if req.echo and logprobs is not None and out.prompt_logprobs is not None:
                logprobs = _echoed(state, out, req.logprobs or 0, logprobs, len(prefix))
            choices.append(
                CompletionChoice(
                    index=i * n + c.index,
                    text=prefix + c.text,
                    logprobs=logprobs,
                    finish_reason=c.finish_reason,
                    prompt_logprobs=prompt_logprobs,
                )
            )
    return CompletionResponse(
        id=new_id("cmpl"), model=model, choices=choices, usage=_usage(finals, prompt_only)
    )


def _echoed(state: ServerState, out: RequestOutput, k: int, completion, prefix_len: int):
    """The prompt's log-probabilities followed by the completion's (text offsets past the echoed prompt)."""
    head = prompt_completion_logprobs(state.text_of, out.prompt_token_ids, out.prompt_logprobs, k)
    head.tokens += completion.tokens
    head.token_logprobs += completion.token_logprobs
    head.top_logprobs += completion.top_logprobs
    head.text_offset += completion.text_offset
    return head


async def _stream(
    req: CompletionRequest, state: ServerState, model: str, streams: list[RequestStream]
) -> AsyncIterator[bytes]:
    rid, created, n = new_id("cmpl"), now(), req.n or 1
    prompt_only = echo_only(req)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous)
    tracker = DeltaTracker()
    finals: list[RequestOutput | None] = [None] * len(streams)

    def chunk(choices: list[dict], usage: Usage | None = None) -> bytes:
        if usage is None and continuous:  # vLLM's continuous_usage_stats: the usage so far
            usage = _usage([s.last for s in streams if s.last is not None], prompt_only)
        body = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if include_usage:
            body["usage"] = usage.model_dump() if usage is not None else None
        return event(body)

    try:
        if req.echo:
            for i, s in enumerate(streams):
                first = await s.start()
                prompt = (
                    first.prompt
                    if first.prompt is not None
                    else state.tokenizer.decode(first.prompt_token_ids)
                )
                yield chunk(
                    [
                        {"index": i * n + j, "text": prompt, "logprobs": None, "finish_reason": None}
                        for j in range(n)
                    ]
                )
        async for i, out in merge(streams):
            finals[i] = out
            choices = []
            for c in out.outputs:
                if prompt_only:
                    c = _without_completion(c)
                d = tracker.advance(i * n + c.index, c)
                if d is None:
                    continue
                lp = _choice_logprobs(state, c, req.logprobs, d.token_start, d.text_start)
                choices.append(
                    {
                        "index": d.index,
                        "text": d.text,
                        "logprobs": lp.model_dump() if lp else None,
                        "finish_reason": d.finish_reason,
                    }
                )
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], _usage([f for f in finals if f is not None], prompt_only))
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        resp = to_response(exc)
        yield error_event(str(exc), "server_error" if resp.status_code >= 500 else "invalid_request_error")
    yield DONE
