"""POST /tokenize and /detokenize, shaped as vLLM's: text or chat messages -> token ids, and back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from vriksha.net.offload import body_size, off_loop
from vriksha.server.errors import BadRequestError
from vriksha.server.prompts import render_chat
from vriksha.server.protocol import ChatCompletionRequest, ChatMessage, Strict
from vriksha.server.state import ServerState, StateDep
from vriksha.server.tools import plan_tools

router = APIRouter()


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request, state: StateDep) -> Response:
    if req.model is not None:
        state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise BadRequestError("send exactly one of prompt or messages", param="prompt")
    return JSONResponse(await off_loop(body_size(request.headers), _tokenized, req, state))


def _tokenized(req: TokenizeRequest, state: ServerState) -> dict[str, Any]:
    tok = state.tokenizer
    if req.messages is not None:
        chat = ChatCompletionRequest(
            model=state.model_name,
            messages=req.messages,
            tools=req.tools,
            add_generation_prompt=req.add_generation_prompt,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        ids = render_chat(tok, chat, plan_tools(chat, state.tool_parser_name))
    else:
        ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    body: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
    body["token_strs"] = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return body


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, state: StateDep) -> Response:
    if req.model is not None:
        state.check_model(req.model)
    vocab = len(state.tokenizer)
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise BadRequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
    return JSONResponse({"prompt": state.tokenizer.decode(req.tokens)})
