"""vLLM's `/v1/completions/render` and `/v1/chat/completions/render`: a request's prompt token ids without
generating, for routers that match prompts against KV events (vllm-router's kv_aware policy calls these)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vriksha.net.offload import body_size, off_loop
from vriksha.server.prompts import completion_prompts, render_chat
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest, OpenAISampling
from vriksha.server.responses import new_id
from vriksha.server.state import ServerState, StateDep

router = APIRouter()

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "stop", "n")


def _rendered(state: ServerState, req: OpenAISampling, token_ids: list[int], prefix: str) -> dict[str, Any]:
    params = {k: getattr(req, k) for k in _SAMPLING if getattr(req, k, None) is not None}
    return {
        "request_id": new_id(prefix),
        "model": req.model,
        "token_ids": token_ids,
        "prompt_token_ids": token_ids,  # the older name, for older clients
        "sampling_params": params,
        "stream": bool(req.stream),
        "stream_options": req.stream_options.model_dump(exclude_none=True) if req.stream_options else None,
        "token_offsets": None,
    }


@router.post("/v1/completions/render")
async def completions_render(req: CompletionRequest, request: Request, state: StateDep) -> Response:
    state.check_model(req.model)

    def render() -> list[dict[str, Any]]:
        out = []
        for p in completion_prompts(req):
            ids = state.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p)
            out.append(_rendered(state, req, ids, "cmpl"))
        return out

    return JSONResponse(await off_loop(body_size(request.headers), render))


@router.post("/v1/chat/completions/render")
async def chat_render(req: ChatCompletionRequest, request: Request, state: StateDep) -> Response:
    state.check_model(req.model)
    ids = await off_loop(body_size(request.headers), render_chat, state.tokenizer, req)
    return JSONResponse(_rendered(state, req, ids, "chatcmpl"))
