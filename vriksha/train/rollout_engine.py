"""The trainer's engine: a `RolloutEngine` (it plays episodes) that also takes new weights.

Two implement it: the colocated `vriksha.LLM` over a module whose parameters the trainer updates in
place, and `ServerRollout` (`server_rollout.py`), which pushes the module's weights to `vriksha serve`
processes. The trainer, its evaluation and the off-policy producer hold one through this protocol and
never ask which it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import nn

from vriksha.engine.config import EngineConfig
from vriksha.envs.rollout_engine import RolloutEngine
from vriksha.train.config import ModelConfig, RolloutConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TrainingEngine", "build_engine", "colocated_engine"]


@runtime_checkable
class TrainingEngine(RolloutEngine, Protocol):
    def weights_updated(self) -> None:
        """The module's parameters changed: later requests see the new weights (the next version)."""
        ...

    def set_weight_version(self, version: int) -> None:
        """The module's parameters now hold `version`: caches reset, later outputs report `version`."""
        ...

    def flush_cache(self) -> bool:
        """Drop the prefix cache; False when running requests still hold part of it."""
        ...

    def close(self) -> None:
        """Release what the engine holds (a server it started, the module it wraps); later calls do nothing."""
        ...


def colocated_engine(module: nn.Module, tokenizer: Any, engine: EngineConfig) -> TrainingEngine:
    """An engine in this process over `module` (parameters are read in place, never copied)."""
    from vriksha.engine.llm import LLM

    return LLM.from_module(module, tokenizer, engine)


def build_engine(
    module: PreTrainedModel,
    tokenizer: Any,
    cfg: RolloutConfig,
    model_cfg: ModelConfig,
    *,
    out_dir: Path,
    rank: int,
    start_version: int,
) -> TrainingEngine:
    """The engine `rollout.mode` names, over `module`: colocated, or servers (`rollout.servers`, or one
    started here) that get `module`'s weights under `start_version` before the first rollout."""
    if cfg.mode == "server":
        from vriksha.train.server_rollout import ServerRollout

        return ServerRollout(cfg, model_cfg, module, tokenizer, out_dir, rank, start_version)
    return colocated_engine(module, tokenizer, cfg.engine)
