"""LoRA adapters over HTTP, with vLLM's names: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`,
`POST /v1/unload_lora_adapter {"lora_name"}` (both behind the API key), and the `--lora-modules NAME=PATH`
loaded at startup. A request selects an adapter by giving its name as `model`; `/v1/models` lists each adapter
with the base model as its `parent`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from vriksha.errors import ConfigError
from vriksha.lora import AdapterError, LoraAdapter, load_peft_dir
from vriksha.server.errors import BadRequestError, ModelNotFoundError
from vriksha.server.state import StateDep

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None  # vLLM's clients may send it; names alone identify adapters here


def parse_lora_modules(specs: list[str]) -> list[tuple[str, str]]:
    """`--lora-modules` entries, NAME=PATH or vLLM's JSON {"name": ..., "path": ...}, as (name, path)."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        if spec.lstrip().startswith("{"):
            try:
                raw = json.loads(spec)
                name, path = raw["name"], raw["path"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError(f'--lora-modules {spec!r}: JSON entries need "name" and "path"') from None
        else:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise ConfigError(f"--lora-modules {spec!r}: give NAME=PATH (a PEFT adapter directory)")
        out.append((str(name), str(path)))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"--lora-modules names an adapter twice: {names}")
    return out


def read_adapter(name: str, path: str) -> LoraAdapter:
    """The PEFT adapter directory at `path`, as adapter `name`; AdapterError names what is wrong."""
    if not name or "/" in name or name != name.strip():
        raise AdapterError(f"adapter name {name!r} must be non-empty, without '/' or surrounding spaces")
    resolved = Path(path).expanduser()
    if not resolved.is_absolute():
        resolved = Path.cwd() / resolved
    return load_peft_dir(resolved.resolve(), name=name)


def load_at_startup(engine: Any, modules: list[tuple[str, str]], served: list[str]) -> None:
    """Load `--lora-modules` into the (not yet started) engine; ConfigError naming a bad one."""
    for name, path in modules:
        if name in served:
            raise ConfigError(f"--lora-modules {name!r} is also a served model name; pick another name")
        try:
            engine.add_lora(read_adapter(name, path), path=path)
        except AdapterError as exc:
            raise ConfigError(f"--lora-modules {name}={path}: {exc}") from None


def lora_of(state, model: str) -> str | None:
    """The adapter a request's `model` names (None: the base model); 404 naming an unknown one."""
    if model in state.model_names:
        return None
    if any(lr.name == model for lr in _loaded(state)):
        return model
    adapters = [lr.name for lr in _loaded(state)]
    also = f" and the LoRA adapters {adapters}" if adapters else ""
    raise ModelNotFoundError(
        f"the model {model!r} does not exist; this server serves {state.model_names}{also} (see GET /v1/models)",
        param="model",
    )


def _loaded(state) -> list:
    inner = getattr(state.engine, "engine", None)
    list_loras = getattr(inner, "list_loras", None)
    return list_loras() if list_loras is not None else []


def adapter_cards(state) -> list[dict[str, Any]]:
    """A /v1/models card per loaded adapter, its `parent` the base model's served name."""
    from vriksha.server.responses import ModelCard

    return [
        {**ModelCard(id=lr.name, root=lr.path or lr.name, max_model_len=state.max_model_len).model_dump(),
         "parent": state.model_name}
        for lr in _loaded(state)
    ]  # fmt: skip


def _engine_with_lora(state):
    inner = getattr(state.engine, "engine", None)
    if inner is None or getattr(inner, "loras", None) is None:
        raise BadRequestError("LoRA adapters are off on this server; start it with --enable-lora")
    return inner


@router.post("/load_lora_adapter")
async def load_lora_adapter(req: LoadLoraAdapterRequest, state: StateDep) -> Response:
    _engine_with_lora(state)
    if req.lora_name in state.model_names:
        raise BadRequestError(f"{req.lora_name!r} is the base model's served name; pick another adapter name")
    try:
        adapter = await asyncio.to_thread(read_adapter, req.lora_name, req.lora_path)
        await state.engine.call(lambda e: e.add_lora(adapter, path=req.lora_path))
    except AdapterError as exc:
        raise BadRequestError(str(exc), param="lora_path") from None
    logger.info("LoRA adapter %r loaded from %s", req.lora_name, req.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(req: UnloadLoraAdapterRequest, state: StateDep) -> Response:
    from vriksha.engine.core.lora_registry import UnknownLoraError

    _engine_with_lora(state)
    try:
        await state.engine.call(lambda e: e.remove_lora(req.lora_name))
    except UnknownLoraError as exc:
        raise ModelNotFoundError(str(exc), param="lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
