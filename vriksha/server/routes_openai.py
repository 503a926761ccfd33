"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest
from vriksha.server.responses import ModelCard, ModelList
from vriksha.server.routes_lora import adapter_cards
from vriksha.server.serving_chat import create_chat_completion
from vriksha.server.serving_completions import create_completion
from vriksha.server.state import StateDep

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(state: StateDep) -> Response:
    root = str(state.engine.model_name)
    cards = [ModelCard(id=name, root=root, max_model_len=state.max_model_len) for name in state.model_names]
    body = ModelList(data=cards).model_dump()
    body["data"] += adapter_cards(state)  # each LoRA adapter, its `parent` the base model
    return JSONResponse(body)


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, state: StateDep) -> Response:
    if state.lora_of(model_id) is not None:
        return JSONResponse(next(c for c in adapter_cards(state) if c["id"] == model_id))
    return JSONResponse(
        ModelCard(
            id=model_id, root=str(state.engine.model_name), max_model_len=state.max_model_len
        ).model_dump()
    )


@router.post("/completions")
async def completions(req: CompletionRequest, request: Request, state: StateDep) -> Response:
    return await create_completion(req, state, request)


@router.post("/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request, state: StateDep) -> Response:
    return await create_chat_completion(req, state, request)
