"""OpenAI's Responses API: POST /v1/responses, GET /v1/responses/{id}."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from vriksha.server.protocol_responses import ResponsesRequest
from vriksha.server.serving_responses import create_response, get_response
from vriksha.server.state import StateDep

router = APIRouter(prefix="/v1")


@router.post("/responses")
async def responses(req: ResponsesRequest, request: Request, state: StateDep) -> Response:
    return await create_response(req, state, request)


@router.get("/responses/{response_id}")
async def retrieve_response(response_id: str, state: StateDep) -> Response:
    return await get_response(response_id, state)
