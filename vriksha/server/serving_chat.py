"""POST /v1/chat/completions: messages through the chat template, `n` choices, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.net.offload import body_size, off_loop
from vriksha.profiling import phase
from vriksha.reasoning import ReasoningParser, ReasoningStream
from vriksha.server.call_repeats import RepeatGuard
from vriksha.server.deltas import DeltaTracker
from vriksha.server.engine_client import RequestStream
from vriksha.server.errors import BadRequestError, to_response
from vriksha.server.logprobs import chat_logprobs, vllm_prompt_logprobs
from vriksha.server.prompts import render_chat
from vriksha.server.protocol import ChatCompletionRequest
from vriksha.server.reasoning import after_reasoning, prompt_tail
from vriksha.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChoiceLogprobs,
    Delta,
    Usage,
    new_id,
    now,
)
from vriksha.server.sampling import chat_params, check_prompt_logprobs
from vriksha.server.sessions import session_of
from vriksha.server.sse import DONE, error_event, event, sse_response, unless_disconnected
from vriksha.server.state import ServerState
from vriksha.server.tools import ToolPlan, forced_call_grammar, message_fields, missing_call, plan_tools
from vriksha.toolcalls import ContentDelta, ToolCallStream


def _usage(out: RequestOutput) -> Usage:
    return Usage.of(
        len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs), out.num_cached_tokens
    )


def _usage_before(stream: RequestStream) -> Usage:
    """The usage before any completion token (the first chunk of a stream, which only names the role)."""
    first = stream.last
    return Usage.of(len(first.prompt_token_ids), 0, first.num_cached_tokens) if first else Usage()


def _logprobs(
    state: ServerState, req: ChatCompletionRequest, c: CompletionOutput, start: int = 0
) -> ChoiceLogprobs | None:
    if not req.logprobs:
        return None
    steps = c.logprobs[start:] if c.logprobs else None
    return chat_logprobs(
        state.text_of, c.token_ids[start:], c.token_logprobs[start:], steps, req.top_logprobs or 0
    )


@dataclass(slots=True)
class PreparedChat:
    plan: ToolPlan
    prompt_ids: list[int]
    params: SamplingParams
    reasoning: ReasoningParser | None  # the --reasoning-parser, or None
    prompt_tail: str | None  # the prompt's last tokens as text, where a reasoning parser looks at them

    def reasoning_stream(self) -> ReasoningStream | None:
        return None if self.reasoning is None else self.reasoning.stream(self.prompt_tail)

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, answer) of a whole reply."""
        return (None, text) if self.reasoning is None else self.reasoning.split(text, self.prompt_tail)


def prepare_chat(req: ChatCompletionRequest, state: ServerState) -> PreparedChat:
    """`_prepare`, with the reasoning parser's view of the prompt: structured outputs (and a forced call's
    grammar) then apply to the answer after an optional reasoning block."""
    plan, prompt_ids, params = _prepare(req, state)
    parser = state.reasoning_parser
    if parser is None:
        return PreparedChat(plan, prompt_ids, params, None, None)
    tail = prompt_tail(state.tokenizer, prompt_ids)
    if params.structured_outputs is not None:
        params.structured_outputs = after_reasoning(
            params.structured_outputs,
            parser,
            parser.starts_in_reasoning(tail),
            own_lark=plan.forced is not None,
        )
    return PreparedChat(plan, prompt_ids, params, parser, tail)


def _prepare(req: ChatCompletionRequest, state: ServerState) -> tuple[ToolPlan, list[int], SamplingParams]:
    """The request's tools, prompt token ids and sampling parameters (off the event loop when large)."""
    with phase("server.parse"):
        plan = plan_tools(req, state.tool_parser_name)
        prompt_ids = render_chat(state.tokenizer, req, plan, state.encoder.encode)
        params = chat_params(req, len(prompt_ids), state.max_model_len)
        if plan.forced is not None:
            if params.structured_outputs is not None:
                raise BadRequestError(
                    "tool_choice forces a call, which cannot be combined with response_format or "
                    "structured_outputs; drop one of them",
                    param="tool_choice",
                )
            params.structured_outputs = forced_call_grammar(plan)
        check_prompt_logprobs(params, [len(prompt_ids)], 1, state.config.max_prompt_logprobs)
    return plan, prompt_ids, params


async def create_chat_completion(
    req: ChatCompletionRequest, state: ServerState, request: Request
) -> Response:
    model = state.check_model(req.model)
    prep = await off_loop(body_size(request.headers), prepare_chat, req, state)
    plan, prompt_ids, params = prep.plan, prep.prompt_ids, prep.params
    session = session_of(req.session_id, request)
    stream = state.client.open(prompt_ids, params, "chat", lora=state.lora_of(model), session_id=session)
    try:
        await unless_disconnected(request, stream.start(), state.drain)
    except BaseException:
        await stream.aclose()
        raise
    guard = RepeatGuard(plan) if plan.forced is not None else None
    if req.stream:
        return sse_response(_stream(req, state, model, stream, prep, guard), [stream], state.drain)
    final = await unless_disconnected(request, final_output(stream, guard), state.drain)
    choices = []
    for c in final.outputs:
        if guard is not None:
            c = guard.view(c)
        reasoning, answer = prep.split(c.text)
        content, calls, finish = message_fields(plan, answer, c.finish_reason)
        if reasoning is not None and not content:
            content = None  # cut off while reasoning: no answer
        if plan.forced is not None and not calls:
            raise missing_call(plan, c.finish_reason)
        choices.append(
            ChatChoice(
                index=c.index,
                message=AssistantMessage(content=content, tool_calls=calls, reasoning_content=reasoning),
                logprobs=_logprobs(state, req, c),
                finish_reason=finish,
            )
        )
    body = ChatCompletionResponse(id=new_id("chatcmpl"), model=model, choices=choices, usage=_usage(final))
    if req.prompt_logprobs is None:
        return JSONResponse(body.model_dump())

    def with_prompt_logprobs() -> JSONResponse:  # a large body: built off the event loop
        body.prompt_logprobs = vllm_prompt_logprobs(
            state.text_of, final.prompt_token_ids, final.prompt_logprobs
        )
        return JSONResponse(body.model_dump())

    return await off_loop(None, with_prompt_logprobs)


async def final_output(stream: RequestStream, guard: RepeatGuard | None) -> RequestOutput:
    """The last output: the engine's final one, or the one at which every choice repeated a forced call
    (the request is then aborted)."""
    if guard is None or not guard.active:
        return await stream.final()
    last = None
    async for out in stream:
        last = out
        if guard.settled(out):
            break
    assert last is not None
    return last


class _ToolDeltas:
    """One choice's streamed text through the tool-call parser: content deltas and OpenAI tool_calls deltas."""

    def __init__(self, plan: ToolPlan) -> None:
        assert plan.parser is not None
        self.stream: ToolCallStream = plan.parser.stream()
        self.parallel = plan.parallel
        self.calls = 0

    def delta(self, text: str, final: bool) -> dict:
        pieces = self.stream.feed(text) + (self.stream.finish() if final else [])
        content = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
        calls = [
            p.to_openai()
            for p in pieces
            if not isinstance(p, ContentDelta) and (self.parallel or p.index == 0)
        ]
        self.calls = max(self.calls, *(c["index"] + 1 for c in calls)) if calls else self.calls
        out: dict = {}
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = calls
        return out


async def _stream(
    req: ChatCompletionRequest,
    state: ServerState,
    model: str,
    stream: RequestStream,
    prep: PreparedChat,
    guard: RepeatGuard | None,
) -> AsyncIterator[bytes]:
    plan = prep.plan
    rid, created = new_id("chatcmpl"), now()
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous)
    tracker = DeltaTracker()
    last: RequestOutput | None = None
    tools: dict[int, _ToolDeltas] = {}
    thinking: dict[int, ReasoningStream | None] = {}

    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> bytes:
        if usage is None and continuous:  # vLLM's continuous_usage_stats: the usage so far
            usage = _usage(last) if last is not None else _usage_before(stream)
        body = ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, usage=usage)
        return event(body.model_dump(exclude=None if include_usage else {"usage"}))

    try:
        first = Delta(role="assistant", content="")
        yield chunk([ChatChunkChoice(index=i, delta=first) for i in range(stream.params.n)])
        async for out in stream:
            last = out
            choices = []
            for c in out.outputs:
                if guard is not None:
                    c = guard.view(c)
                d = tracker.advance(c.index, c)
                if d is None:
                    continue
                finish = d.finish_reason
                text, reasoning = d.text or "", None
                if c.index not in thinking:
                    thinking[c.index] = prep.reasoning_stream()
                split = thinking[c.index]
                if split is not None:
                    piece = split.feed(text, final=finish is not None)
                    text, reasoning = piece.content, piece.reasoning or None
                if plan.parser is not None:
                    parsed = tools.setdefault(c.index, _ToolDeltas(plan))
                    body = parsed.delta(text, finish is not None)
                    delta = Delta(
                        content=body.get("content"),
                        tool_calls=body.get("tool_calls"),
                        reasoning_content=reasoning,
                    )
                    if parsed.calls and finish == "stop":
                        finish = "tool_calls"
                    if finish is not None and plan.forced is not None and not parsed.calls:
                        raise missing_call(plan, finish)
                else:
                    delta = Delta(content=text or None, reasoning_content=reasoning)
                choices.append(
                    ChatChunkChoice(
                        index=c.index,
                        delta=delta,
                        logprobs=_logprobs(state, req, c, d.token_start),
                        finish_reason=finish,
                    )
                )
            if choices:
                yield chunk(choices)
            if guard is not None and guard.settled(out):
                break
        if include_usage and last is not None:
            yield chunk([], _usage(last))
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        resp = to_response(exc)
        yield error_event(str(exc), "server_error" if resp.status_code >= 500 else "invalid_request_error")
    yield DONE
