"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API over the chat path (the input
items become chat messages, rendered by the chat template; tools, tool_choice and text.format become the
chat request's), whole or streamed as Responses events; kept for `previous_response_id`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.net.offload import body_size, off_loop
from vriksha.server.call_repeats import RepeatGuard
from vriksha.server.deltas import DeltaTracker
from vriksha.server.engine_client import RequestStream
from vriksha.server.errors import ServerError
from vriksha.server.protocol_responses import ResponsesRequest
from vriksha.server.responses import now
from vriksha.server.responses_events import ResponseEvents
from vriksha.server.responses_items import (
    chat_request,
    item_id,
    items_as_messages,
    output_items,
    response_body,
    response_usage,
)
from vriksha.server.serving_chat import PreparedChat, final_output, prepare_chat
from vriksha.server.sessions import session_of
from vriksha.server.sse import sse_response, unless_disconnected
from vriksha.server.state import ServerState
from vriksha.server.tools import message_fields, missing_call
from vriksha.toolcalls import ContentDelta, ToolCallDelta, ToolCallStream


class ResponseNotFoundError(ServerError, status=404, type="invalid_request_error", code="response_not_found"):
    """An unknown, dropped or expired response id."""


def _stored(state: ServerState, rid: str, param: str) -> Any:
    stored = state.responses.get(rid)
    if stored is None:
        raise ResponseNotFoundError(
            f"no response with id {rid!r}: it is unknown, or no longer kept (this server keeps the last "
            f"{state.config.responses_max_stored} responses for {state.config.responses_ttl_s:g} s after their "
            "last use, and none sent with store=false); send the whole conversation as input instead",
            param=param,
        )
    return stored


async def get_response(rid: str, state: ServerState) -> Response:
    return JSONResponse(_stored(state, rid, "response_id").body)


class _Reply:
    """The finished reply's numbers and status, common to the whole and the streamed response."""

    def __init__(
        self, state: ServerState, out: RequestOutput, choice: CompletionOutput, reasoning: str | None
    ):
        self.reasoning_tokens = (
            len(state.encoder.encode(reasoning)) if reasoning else 0
        )  # the reasoning text re-encoded: the tokens it took, but for a token merged across the closing tag
        self.usage = response_usage(
            len(out.prompt_token_ids), out.num_cached_tokens, len(choice.token_ids), self.reasoning_tokens
        )
        length = choice.finish_reason == "length"
        self.status = "incomplete" if length else "completed"
        self.incomplete = "max_output_tokens" if length else None


async def create_response(req: ResponsesRequest, state: ServerState, request: Request) -> Response:
    model = state.check_model(req.model)
    previous = (
        _stored(state, req.previous_response_id, "previous_response_id") if req.previous_response_id else None
    )
    history = previous.conversation if previous is not None else []
    conversation_id = previous.conversation_id if previous is not None else None
    chat, conversation = chat_request(req, history)
    prep = await off_loop(body_size(request.headers), prepare_chat, chat, state)
    rid, created = item_id("resp"), now()
    # a stored conversation is an engine session: its K/V stays pinned for the next previous_response_id
    session = session_of(None, request) or (
        f"response:{conversation_id or rid}" if req.store is not False else None
    )
    stream = state.client.open(
        prep.prompt_ids, prep.params, "responses", lora=state.lora_of(model), session_id=session
    )
    try:
        await unless_disconnected(request, stream.start(), state.drain)
    except BaseException:
        await stream.aclose()
        raise
    guard = RepeatGuard(prep.plan) if prep.plan.forced is not None else None
    if req.stream:
        events = _stream(
            req, state, model, rid, created, stream, prep, guard, (conversation, conversation_id)
        )
        return sse_response(events, [stream], state.drain)
    final = await unless_disconnected(request, final_output(stream, guard), state.drain)
    choice = guard.view(final.outputs[0]) if guard is not None else final.outputs[0]
    reasoning, answer = prep.split(choice.text)
    content, calls, _ = message_fields(prep.plan, answer, choice.finish_reason)
    if prep.plan.forced is not None and not calls:
        raise missing_call(prep.plan, choice.finish_reason)
    items = output_items(reasoning, content, calls)
    reply = _Reply(state, final, choice, reasoning)
    body = response_body(req, rid, created, model, items, reply.status, reply.usage, reply.incomplete)
    _keep(state, req, body, (conversation, conversation_id))
    return JSONResponse(body)


def _keep(
    state: ServerState, req: ResponsesRequest, body: dict[str, Any], history: tuple[list[dict], str | None]
) -> None:
    """Store the response (unless `store: false`) with its conversation so far and the conversation's id."""
    conversation, conversation_id = history
    if req.store is not False:
        state.responses.put(body, conversation + items_as_messages(body["output"]), conversation_id)


def _event(obj: dict[str, Any]) -> bytes:
    """`event: <type>` and its data, as OpenAI writes Responses events."""
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"event: {obj['type']}\ndata: {data}\n\n".encode()


async def _stream(
    req: ResponsesRequest,
    state: ServerState,
    model: str,
    rid: str,
    created: int,
    stream: RequestStream,
    prep: PreparedChat,
    guard: RepeatGuard | None,
    history: tuple[list[dict[str, Any]], str | None],
) -> AsyncIterator[bytes]:
    events = ResponseEvents()
    thinking = prep.reasoning_stream()
    calls: ToolCallStream | None = prep.plan.parser.stream() if prep.plan.parser is not None else None
    tracker = DeltaTracker()
    called = False
    reasoning_text: list[str] = []

    def body(status: str, reply: _Reply | None = None) -> dict[str, Any]:
        usage = reply.usage if reply is not None else None
        incomplete = reply.incomplete if reply is not None else None
        return response_body(req, rid, created, model, list(events.items), status, usage, incomplete)

    try:
        yield _event(events.lifecycle("response.created", body("in_progress")))
        yield _event(events.lifecycle("response.in_progress", body("in_progress")))
        last: RequestOutput | None = None
        choice: CompletionOutput | None = None
        async for out in stream:
            last = out
            choice = guard.view(out.outputs[0]) if guard is not None else out.outputs[0]
            d = tracker.advance(0, choice)
            if d is not None:
                final = d.finish_reason is not None
                text, reasoning = d.text, ""
                if thinking is not None:
                    piece = thinking.feed(text, final=final)
                    text, reasoning = piece.content, piece.reasoning
                    reasoning_text.append(reasoning)
                if calls is not None:
                    parsed = calls.feed(text) + (calls.finish() if final else [])
                    if not prep.plan.parallel:
                        parsed = [p for p in parsed if not isinstance(p, ToolCallDelta) or p.index == 0]
                else:
                    parsed = [ContentDelta(text)] if text else []
                called = called or any(isinstance(p, ToolCallDelta) for p in parsed)
                for e in events.pieces(reasoning, parsed):
                    yield _event(e)
                if final and prep.plan.forced is not None and not called:
                    raise missing_call(prep.plan, d.finish_reason)
            if guard is not None and guard.settled(out):
                break
        for e in events.close():
            yield _event(e)
        assert last is not None and choice is not None
        has_reasoning = thinking is not None and thinking.saw_reasoning
        reply = _Reply(state, last, choice, "".join(reasoning_text) if has_reasoning else None)
        done = body(reply.status, reply)
        _keep(state, req, done, history)
        kind = "response.completed" if reply.status == "completed" else "response.incomplete"
        yield _event(events.lifecycle(kind, done))
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        failed = body("failed")
        failed["error"] = {"code": getattr(exc, "code", None) or "server_error", "message": str(exc)}
        yield _event(events.lifecycle("response.failed", failed))
