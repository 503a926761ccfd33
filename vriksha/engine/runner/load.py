"""The engine's load: the model (from a path, or a module handed in), the platform plan for this machine, the
KV pool laid out from the model's own attention, and the model runner over them.

The engine core (`core/llm_engine.py`) reaches the model through this one door: what it gets back is a
`LoadedModel`, whose runner computes a scheduled batch's logits and whose plan holds every decision taken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

import vriksha.device as devices
from vriksha.engine.attention.layout_probe import probe_kv_layout
from vriksha.engine.config import EngineConfig
from vriksha.engine.core.kv_pool import KVPool, ReqToTokenTable, kv_slots
from vriksha.engine.platform import plan as platform_plan
from vriksha.engine.platform.plan import PlatformPlan
from vriksha.engine.runner.model_runner import ModelRunner
from vriksha.errors import InvalidRequestError

if TYPE_CHECKING:
    from vriksha.engine.tensor_parallel import TensorParallelGroup

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    model: nn.Module
    tokenizer: Any
    name: str
    max_model_len: int
    plan: PlatformPlan  # every platform decision, the runner's included
    pool: KVPool
    table: ReqToTokenTable
    runner: ModelRunner
    tensor_parallel: TensorParallelGroup | None  # the other ranks, when the engine runs on several

    def close(self) -> None:
        """Hand the model back as it came and stop the other ranks."""
        self.runner.close()
        if self.tensor_parallel is not None:
            self.tensor_parallel.close()


def load(config: EngineConfig, model: nn.Module | None = None, tokenizer=None) -> LoadedModel:
    """Load `config.model` (or take `model` and its `tokenizer`) and build the runner over it."""
    tp = None
    if config.tensor_parallel_size > 1:
        if model is not None:
            raise InvalidRequestError(
                "tensor_parallel_size > 1 loads the model on every rank: give a model path, not a module"
            )
        from vriksha.engine.tensor_parallel import TensorParallelGroup

        tp = TensorParallelGroup(config)
    try:
        return _load(config, model, tokenizer, tp)
    except BaseException:
        if tp is not None:
            tp.close()
        raise


def _load(
    config: EngineConfig, model: nn.Module | None, tokenizer, tp: TensorParallelGroup | None
) -> LoadedModel:
    gguf: Path | None = None
    if model is None:
        from vriksha.loading import load_model
        from vriksha.loading.loader import gguf_source

        device = tp.device if tp is not None else devices.resolve(config.device)
        # every rank computes in the dtype rank 0 chose (before it started them)
        dtype = tp.dtype_choice if tp is not None else platform_plan.resolve_dtype(config, device)
        loaded = load_model(config.model, dtype=dtype.dtype, device=device)
        model, tokenizer, name = loaded.model, loaded.tokenizer, loaded.name
        gguf = gguf_source(config.model) if tp is None else None  # ranks hold shards, not the file's rows
    else:
        dtype = platform_plan.module_dtype(model, config)
        name = getattr(model.config, "_name_or_path", None) or type(model).__name__
        if config.model is not None:  # a module converted from this file: its GGUF blocks may be served
            from vriksha.loading.loader import gguf_source

            gguf = gguf_source(config.model)
    if tokenizer is None:
        raise InvalidRequestError("an engine built around a module needs its tokenizer")
    text_config = model.config.get_text_config()
    max_model_len = config.max_model_len or int(getattr(text_config, "max_position_embeddings", 4096))
    plan = platform_plan.resolve(config, model, dtype, tensor_parallel=tp is not None)
    if tp is not None:
        tp.join(model)  # every rank keeps its shard of the heads and MLP columns
    layout = probe_kv_layout(model)
    num_slots = kv_slots(config, plan.device, layout, plan.kv_dtype)
    if tp is not None:
        num_slots = tp.min_slots(num_slots)
    pool = KVPool(layout, num_slots, plan.kv_dtype, plan.device)
    table = ReqToTokenTable(config.max_num_seqs + 1, max_model_len + 1, plan.device)
    runner = ModelRunner(model, pool, table, config, plan, gguf=gguf, tensor_parallel=tp)
    for line in runner.plan.lines():
        logger.info("platform: %s", line)
    return LoadedModel(model, tokenizer, name, max_model_len, runner.plan, pool, table, runner, tp)
