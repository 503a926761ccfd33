"""vriksha: serve, build environments, train with GRPO, measure. PyTorch-native."""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "vriksha.engine.core.llm",
    "SamplingParams": "vriksha.engine.core.sampling_params",
    "RequestOutput": "vriksha.engine.core.outputs",
    "CompletionOutput": "vriksha.engine.core.outputs",
    "AsyncEngine": "vriksha.engine.core.async_engine",
    "EngineConfig": "vriksha.engine.config",
}

if TYPE_CHECKING:
    from vriksha.engine.config import EngineConfig
    from vriksha.engine.core.async_engine import AsyncEngine
    from vriksha.engine.core.llm import LLM
    from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
    from vriksha.engine.core.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vriksha' has no attribute {name!r}")


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "AsyncEngine", "EngineConfig"]
