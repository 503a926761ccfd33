"""What a client asks of a vLLM-style server before it sends work: GET /version, GET|POST /ping (SageMaker's
health check), GET /tokenizer_info (vLLM's: the tokenizer's settings and chat template), and a refusal of
POST /v1/embeddings that says this server does not make embeddings."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

import vriksha
from vriksha.server.errors import ServerError
from vriksha.server.routes_native import health
from vriksha.server.state import StateDep

router = APIRouter()

# tokenizer settings that name files on this machine, not how the tokenizer behaves
_PATHS = ("vocab_file", "merges_file", "tokenizer_file", "name_or_path")


class EmbeddingsNotServedError(
    ServerError, status=400, type="invalid_request_error", code="model_not_supported"
):
    """An embeddings request to a server of a generative model."""


def _json_value(value: Any) -> Any:
    """A tokenizer setting as JSON: an added token as its text, containers element by element, anything else
    JSON has no type for as its string."""
    if hasattr(value, "content"):  # tokenizers' AddedToken
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def tokenizer_info(tokenizer: Any, model: str) -> dict[str, Any]:
    """vLLM's /tokenizer_info body: the tokenizer's init settings (without file paths), its class and its chat
    template."""
    settings = dict(getattr(tokenizer, "init_kwargs", None) or {})
    for name in _PATHS:
        settings.pop(name, None)
    info = _json_value(settings)
    info["name_or_path"] = model
    info["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        info["chat_template"] = template
    return info


@router.get("/version")
async def version() -> Response:
    return JSONResponse({"version": vriksha.__version__})


@router.api_route("/ping", methods=["GET", "POST"])
async def ping(state: StateDep) -> Response:
    return await health(state)


@router.get("/tokenizer_info")
async def get_tokenizer_info(state: StateDep) -> Response:
    return JSONResponse(tokenizer_info(state.tokenizer, state.model_name))


@router.post("/v1/embeddings")
async def embeddings(state: StateDep) -> Response:
    raise EmbeddingsNotServedError(
        f"embeddings are not served by this model server: it serves {state.model_name} for generation "
        "(POST /v1/completions, /v1/chat/completions); send embedding requests to a server of an embedding "
        "model",
        param="model",
    )
