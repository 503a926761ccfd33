"""`GET /health`, `/metadata`, `/schema`: what the environment server serves and how full it is."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vriksha.envs.app_state import EnvState
from vriksha.envs.core import StepResult
from vriksha.envs.protocol import PROTOCOL_VERSION, protocol_schema

router = APIRouter()


@router.get("/health")
async def health(state: EnvState) -> dict[str, Any]:
    return {"status": "healthy", "env": state.env_cls.name, **state.manager.capacity()}


@router.get("/metadata")
async def metadata(state: EnvState) -> dict[str, Any]:
    meta = {k: v for k, v in state.env_cls.metadata().items() if k != "schemas"}
    return {**meta, "version": str(PROTOCOL_VERSION), "server": state.server_info()}


@router.get("/schema")
async def schema(state: EnvState) -> dict[str, Any]:
    return {
        **state.env_cls.schemas(),
        "step_result": StepResult.model_json_schema(),
        "protocol": protocol_schema(),
    }
