"""The engine's load: the model (from a path, or a module handed in), the decisions taken once for this
machine, the KV pool laid out from the model's own attention, and the model runner over them.

The engine core (`core/llm_engine.py`) reaches the model through this one door: what it gets back is a
`LoadedModel`, whose runner computes a scheduled batch's logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

import vriksha.device as devices
from vriksha import fast_dtype
from vriksha.engine import fp32_precision, host_memory
from vriksha.engine.attention.layout_probe import probe_kv_layout
from vriksha.engine.config import EngineConfig
from vriksha.engine.core.kv_pool import KVPool, ReqToTokenTable, kv_cache_dtype, kv_slots
from vriksha.engine.quantization import int8_activations, packed_dtype
from vriksha.engine.runner.model_runner import ModelRunner
from vriksha.engine.step_threads import StepThreads
from vriksha.errors import InvalidRequestError

if TYPE_CHECKING:
    from vriksha.engine.tensor_parallel import TensorParallelGroup

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    model: nn.Module
    tokenizer: Any
    name: str
    dtype_choice: fast_dtype.DtypeChoice
    max_model_len: int
    host_malloc: host_memory.MallocChoice | None
    bf16_arithmetic: bool  # an fp32 model's matmuls may run in bf16 arithmetic (fp32_precision)
    step_threads: StepThreads
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
        if tp is not None:
            dtype_choice = tp.dtype_choice
        else:
            dense = fast_dtype.resolve(config.dtype, config.model, device)
            dtype_choice = packed_dtype(dense, config, device) or dense
        loaded = load_model(config.model, dtype=dtype_choice.dtype, device=device)
        model, tokenizer, name = loaded.model, loaded.tokenizer, loaded.name
        gguf = gguf_source(config.model) if tp is None else None  # ranks hold shards, not the file's rows
    else:
        param = next(model.parameters())
        dtype_choice = fast_dtype.given(param.dtype, param.device, how="the module's own", requested=config.dtype)
        name = getattr(model.config, "_name_or_path", None) or type(model).__name__
        if config.model is not None:  # a module converted from this file: its GGUF blocks may be served
            from vriksha.loading.loader import gguf_source

            gguf = gguf_source(config.model)
    if tokenizer is None:
        raise InvalidRequestError("an engine built around a module needs its tokenizer")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    text_config = model.config.get_text_config()
    max_model_len = config.max_model_len or int(getattr(text_config, "max_position_embeddings", 4096))

    host = devices.is_host(device)
    host_malloc = host_memory.keep_freed_memory(config.host_malloc_tuning) if host else None
    if tp is not None:
        tp.join(model)  # every rank keeps its shard of the heads and MLP columns
    # every tensor-parallel rank runs the same arithmetic: strict fp32 there
    measured = tp is None and dtype_choice.how.startswith(("measured", "cached"))
    bf16_arithmetic = fp32_precision.resolve(config.fp32_precision, dtype, measured, host)
    kv_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype, bf16_arithmetic, tp is not None)
    layout = probe_kv_layout(model)
    num_slots = kv_slots(config, device, layout, kv_dtype)
    if tp is not None:
        num_slots = tp.min_slots(num_slots)
    pool = KVPool(layout, num_slots, kv_dtype, device)
    table = ReqToTokenTable(config.max_num_seqs + 1, max_model_len + 1, device)
    runner = ModelRunner(
        model,
        pool,
        table,
        config,
        gguf=gguf,
        bf16_matmuls=bf16_arithmetic,
        int8_activations=int8_activations(config.packed_activations, config.fp32_precision, measured),
        tensor_parallel=tp,
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        dtype_choice=dtype_choice,
        max_model_len=max_model_len,
        host_malloc=host_malloc,
        bf16_arithmetic=bf16_arithmetic,
        step_threads=StepThreads(config.front_end_core, host and tp is None),
        pool=pool,
        table=table,
        runner=runner,
        tensor_parallel=tp,
    )
