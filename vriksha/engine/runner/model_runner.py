"""Runs the engine's forward passes on a Transformers model: its forward paths, assembled once at load.

At load the runner binds the model's layers to a kernel set, routes its linear layers to their measured
paths, chooses the attention backend for the kernel set and the KV pool's dtype, and assembles the forward
paths that apply into one ordered chain (`forward_path.py`). Each step then runs on the first path that
accepts it.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

import vriksha.device as devices
from vriksha.engine.attention.backend import select_backend
from vriksha.engine.attention.paged import register_attention
from vriksha.engine.config import EngineConfig
from vriksha.engine.core.batch import ForwardBatch
from vriksha.engine.core.kv_pool import KVPool, ReqToTokenTable
from vriksha.engine.platform import dense_linear, fp32_precision, hub_layers, quantization
from vriksha.engine.platform import native as native_lib
from vriksha.engine.platform.lora_linear import LoraLinears
from vriksha.engine.platform.module_installation import ModuleInstallation
from vriksha.engine.platform.plan import PlatformPlan, RunnerChoices
from vriksha.engine.runner import native_decode_choice
from vriksha.engine.runner.decode_graphs import DecodeGraphs
from vriksha.engine.runner.forward_path import ForwardPath, ForwardScope, TransformersForward, first_accepting
from vriksha.engine.runner.lean_forward import LeanForward
from vriksha.engine.runner.native_decode import MAX_BATCH, NativeDecode
from vriksha.engine.runner.step import ForwardStep
from vriksha.engine.runner.step_builder import StepBuilder

if TYPE_CHECKING:
    from vriksha.engine.tensor_parallel import TensorParallelGroup

logger = logging.getLogger(__name__)

P = TypeVar("P")


class ModelRunner:
    """Runs the engine's forward passes on `model`; its changes to the model are undone by `close()`."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        table: ReqToTokenTable,
        config: EngineConfig,
        plan: PlatformPlan,
        gguf: Path | None = None,
        tensor_parallel: TensorParallelGroup | None = None,
    ) -> None:
        """`plan`: the platform decisions taken before the runner (`platform/plan.py`); the runner's own are
        recorded in `self.plan.runner`. `gguf`: the file the model was loaded from, whose packed blocks
        `quantization` may serve; `tensor_parallel`: rank 0's group, to which every step is broadcast before
        it runs. The KV pool may hold another dtype than the model (`kv_cache_dtype`)."""
        self.model = model
        self.pool = pool
        self.table = table
        self.device = pool.device
        self.installation = ModuleInstallation(model)
        self.installation.set_attn_implementation(register_attention())
        dtype = next(model.parameters()).dtype
        self.kernels = plan.kernels
        if config.platform.kernel_layers:
            self.kernels = hub_layers.bind(
                model, config.platform.kernel_layers, self.installation, self.kernels
            )
        self.attention = select_backend(self.kernels, pool.dtype)
        self.bf16_matmuls = plan.bf16_matmuls
        self.threads = plan.threads
        self.fast_linear: dense_linear.DenseLinear | None = None
        if plan.linear_paths:
            self.fast_linear = dense_linear.DenseLinear(
                model, self.installation, self.kernels.linear_for(dtype), self.bf16_matmuls
            )
        self.quant, self.quantization = quantization.apply(
            model,
            config.quantization,
            self.installation,
            self.kernels.linear_for(dtype),
            gguf,
            devices.is_host(self.device),
            self.bf16_matmuls and self.fast_linear is not None,
            activations=plan.packed_activations,
        )
        self._build_linear_layouts()
        self.matmul_choice = self._describe_matmuls()
        # after the base linears' routes: the LoRA deltas add to whatever path the base linear took
        self.lora = LoraLinears(model, self.installation) if config.enable_lora else None
        self.scope = ForwardScope([r for r in (self.fast_linear, self.quant) if r is not None], self.lora)
        self.paths: list[ForwardPath] = self._assemble(config, tensor_parallel)
        self.plan = dataclasses.replace(
            plan,
            runner=RunnerChoices(
                kernels=self.kernels.describe(),
                attention=self.attention.describe(),
                quantization=self.quantization,
                matmuls=self.matmul_choice,
                native_decode=self.native_decode_choice,
                cuda_graphs=self.decode_graphs_choice,
                forward_paths=tuple(p.name for p in self.paths),
            ),
        )

    def _assemble(
        self, config: EngineConfig, tensor_parallel: TensorParallelGroup | None
    ) -> list[ForwardPath]:
        """The forward paths that apply here, in the order a step tries them."""
        lean: LeanForward | None = None
        if config.platform.fast_forward:
            try:
                lean = LeanForward(self.model, self.kernels, self.scope)
            except ValueError as exc:
                logger.info("Transformers forward for every step: %s", exc)
        excluded = (
            "tensor parallel or hub kernel layers"
            if config.tensor_parallel_size > 1 or config.platform.kernel_layers
            else None
        )
        native, self.native_decode_choice = native_decode_choice.set_up(
            config.platform.native_decode,
            self.model,
            self.kernels,
            self.pool,
            self.quant,
            lean,
            self.attention,
            self.scope,
            self.bf16_matmuls,
            excluded,
        )
        rows_limit = MAX_BATCH if native is None else native.max_batch
        self.builder = StepBuilder(self.pool, self.table, self.attention, rows_limit)
        paths: list[ForwardPath] = [p for p in (native, lean) if p is not None]
        paths.append(TransformersForward(self.model, self.scope))
        if tensor_parallel is not None:
            from vriksha.engine.tensor_parallel.forward_path import TensorParallelPath

            paths = [TensorParallelPath(p, tensor_parallel) for p in paths]
        self.paths = paths  # the decode graphs capture through these
        graphs, self.decode_graphs_choice = self._set_up_decode_graphs(config, lean is not None)
        return [graphs, *paths] if graphs is not None else paths

    def _set_up_decode_graphs(self, config: EngineConfig, lean: bool) -> tuple[DecodeGraphs | None, str]:
        """The decode graphs path for `--cuda-graphs`, or None, and what was decided (logs, --verbose)."""
        mode = config.platform.cuda_graphs
        if mode == "off":
            return None, "off"
        if devices.graph_module(self.device) is None:
            return None, "off: CUDA graphs need a CUDA device"
        if config.tensor_parallel_size > 1:
            return None, "off: tensor parallel"
        if mode == "auto" and not lean:
            return None, "off: the model runs the Transformers forward (--cuda-graphs on captures it anyway)"
        if mode == "auto" and self.attention.decode_kernel is None:
            return None, (
                "off: the kernel set's decode attention gathers K/V (the triton set reads the pool in place)"
            )
        max_batch = min(
            config.platform.cuda_graph_max_batch, config.max_num_seqs, config.max_num_batched_tokens
        )
        try:
            graphs = DecodeGraphs(
                self.run, self.model, self.pool, self.table.table, self.attention, max_batch
            )
        except Exception as exc:  # a forward that cannot be captured, e.g. one that reads a device value
            devices.synchronize(self.device)
            logger.warning("decode steps stay eager: capturing them as CUDA graphs failed: %s", exc)
            return None, f"off: capture failed ({type(exc).__name__}: {exc})"
        choice = f"{mode}: {graphs.describe()}"
        logger.info("CUDA graphs %s", choice)
        return graphs, choice

    def _describe_matmuls(self) -> str:
        """Which fp32 matmuls run in bf16 arithmetic (logs, --verbose)."""
        text = fp32_precision.describe(self.bf16_matmuls)
        if self.bf16_matmuls and self.fast_linear is not None:
            buckets = self.fast_linear.bf16_buckets()
            dense = f"dense calls of {', '.join(map(str, buckets))} rows" if buckets else "no dense call"
            text += f": {dense}"
            if self.quant is not None:
                text += " (packed layers take the dense path only where it measured faster)"
        return text

    def _build_linear_layouts(self) -> None:
        """The dense linear paths' derived weight copies, made now for the layers whose calls may take them;
        a layer the packed kernels serve at every bucket makes its copy only if a call ever needs it."""
        if self.fast_linear is None:
            return
        skip = self.quant.always_packed() if self.quant is not None else set()
        nbytes = self.fast_linear.build_layouts(skip)
        if skip:
            logger.info(
                "derived fp32/bf16 weight copies: %.0f MiB (none for the %d layers served packed at every batch size)",
                nbytes / 2**20,
                len(skip),
            )

    # ---- the chain ---------------------------------------------------------------------------------
    def path(self, kind: type[P]) -> P | None:
        """The chain's path of class `kind` (under tensor parallel, the one it wraps), or None."""
        for p in self.paths:
            inner = getattr(p, "inner", p)
            if isinstance(inner, kind):
                return inner
        return None

    @property
    def native(self) -> native_lib.Kernels | None:
        """The native C kernels when the kernel set is a native one, else None."""
        return getattr(self.kernels, "lib", None)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [num_sampled, vocab] for the requests that sample a token this step, followed by the rows of
        prompt positions whose log-probabilities were asked for (`prompt_logprobs.extra_rows`), then every
        position of the draft runs."""
        self.threads.apply(batch.num_tokens)
        return self.run(ForwardStep(batch, build=self.builder))

    def run(self, step: ForwardStep) -> torch.Tensor:
        """The step's logits, from the first path that accepts it."""
        return first_accepting(self.paths, step)(step)

    # ---- weights and lifetime ----------------------------------------------------------------------
    def weights_updated(self) -> None:
        if self.fast_linear is not None:
            self.fast_linear.refresh()
        if self.quant is not None:
            self.quant.refresh()
        self._build_linear_layouts()
        for kind in (NativeDecode, DecodeGraphs):
            path = self.path(kind)
            if path is not None:
                path.weights_updated()

    def pool_reallocated(self) -> None:
        """The KV pool's memory was released and taken again, at new addresses: what holds its addresses (the
        native decode's plans, captured decode graphs) is built again."""
        native = self.path(NativeDecode)
        if native is not None:
            native.weights_updated()  # drops its plans, which hold the pool's addresses
        graphs = self.path(DecodeGraphs)
        if graphs is not None and graphs.capture:
            graphs.capture_all()

    def close(self) -> None:
        """Hand the model back as it came: its attention implementation and linear layers restored."""
        self.installation.undo()
        self.fast_linear = None
        self.quant = None
        self.lora = None
        self.paths = []
