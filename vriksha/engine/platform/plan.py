"""The platform plan: every decision the engine takes once for this machine and model, at load.

Resolved in three steps. Before the weights are read, the compute dtype (`resolve_dtype`: the measured choice
of `compute_dtype.py`, with the packed GGUF blocks' say from `quantization.packed_dtype`). Once the model is
in memory (`resolve`): whether an fp32 model's matmuls may run in bf16 arithmetic (`platform/fp32_precision.py`), what
the packed kernels may round activations to (`quantization.packed_activations`), the KV pool's dtype, glibc
malloc's thresholds (`host_malloc.py`), how many threads a step runs on (`platform/step_threads.py`), the kernel set
(`platform/kernel_sets.py`) and whether linear layers take measured paths. The model runner then takes the decisions
that need the model installed and timed (the packed weights, the linear paths' bf16 buckets, the attention
backend, native decode, CUDA graphs and the chain of forward paths) and records them in `runner`.

Nothing decides any of this again per step. `vriksha generate --verbose` prints `lines()`; the engine logs
them at load.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

import vriksha.device as devices
from vriksha.engine.config import EngineConfig
from vriksha.engine.platform import compute_dtype, fp32_precision, host_malloc, kernel_sets
from vriksha.engine.platform.kernel_sets import TorchKernels
from vriksha.engine.platform.native.bitmask import BitmaskKernel, bitmask_kernel
from vriksha.engine.platform.quantization import QuantizationChoice, packed_activations, packed_dtype
from vriksha.engine.platform.step_threads import StepThreads
from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerChoices:
    """What the model runner decided as it assembled (logs, --verbose)."""

    kernels: str  # the kernel set, with any hub layers bound into it
    attention: str  # the attention backend
    quantization: QuantizationChoice
    matmuls: str  # which fp32 matmuls run in bf16 arithmetic
    native_decode: str
    cuda_graphs: str
    forward_paths: tuple[str, ...]  # the chain, in the order a step tries it


@dataclass(frozen=True, slots=True)
class PlatformPlan:
    device: torch.device
    dtype: compute_dtype.DtypeChoice  # the compute dtype, and how it was arrived at
    bf16_matmuls: bool  # an fp32 model's linear layers may run in bf16 arithmetic where measured faster
    packed_activations: str  # the least precise activations the packed kernels may use: float32, int16, int8
    kv_dtype: torch.dtype
    kv_cache_dtype: str  # as requested
    host_malloc: host_malloc.MallocChoice | None  # None off the host
    threads: StepThreads
    kernels: TorchKernels  # the kernel set bound to the engine's layers
    linear_paths: bool  # linear layers take the measured fastest path per shape and batch size
    mask_kernel: BitmaskKernel | None  # applies grammar masks to CPU logits in place
    runner: RunnerChoices | None = None  # filled in once the runner is assembled

    def lines(self) -> list[str]:
        """One line per decision, as `generate --verbose` prints them."""
        kv = str(self.kv_dtype).removeprefix("torch.")
        out = [
            self.dtype.describe(),
            f"kernels {self.runner.kernels if self.runner else self.kernels.describe()}",
            f"KV pool {kv} (kv_cache_dtype {self.kv_cache_dtype})",
            f"linear paths {'measured per shape and batch size' if self.linear_paths else 'torch F.linear'}",
            f"packed activations {self.packed_activations} at most",
            f"threads: {self.threads.describe()}",
            f"grammar masks {'by the native kernel' if self.mask_kernel is not None else 'unpacked with numpy'}",
        ]
        if self.host_malloc is not None:
            out.append(self.host_malloc.describe())
        r = self.runner
        if r is not None:
            out += [
                f"attention {r.attention}",
                r.quantization.describe(),
                f"matmuls {r.matmuls}",
                f"native decode {r.native_decode}",
                f"CUDA graphs {r.cuda_graphs}",
                f"forward paths: {', '.join(r.forward_paths)}",
            ]
        return out


def resolve_dtype(config: EngineConfig, device: torch.device) -> compute_dtype.DtypeChoice:
    """The compute dtype of a model read from `config.model`, decided before its weights are read."""
    dense = compute_dtype.resolve(config.dtype, config.model, device)
    return packed_dtype(dense, config, device) or dense


def module_dtype(model: nn.Module, config: EngineConfig) -> compute_dtype.DtypeChoice:
    """The dtype of an engine around a module it was handed: the module's own."""
    param = next(model.parameters())
    return compute_dtype.given(param.dtype, param.device, how="the module's own", requested=config.dtype)


def resolve(
    config: EngineConfig, model: nn.Module, dtype: compute_dtype.DtypeChoice, tensor_parallel: bool
) -> PlatformPlan:
    """The plan for `model` (in memory, on its device) under `config`; `tensor_parallel`: the engine runs on
    several ranks, which all run the same arithmetic (strict fp32, the model's dtype in the KV pool)."""
    param = next(model.parameters())
    device, model_dtype = param.device, param.dtype
    host = devices.is_host(device)
    malloc = host_malloc.keep_freed_memory(config.platform.host_malloc_tuning) if host else None
    measured = not tensor_parallel and dtype.how.startswith(("measured", "cached"))
    bf16 = fp32_precision.resolve(config.platform.fp32_precision, model_dtype, measured, host)
    kernels = kernel_sets.select(config.platform.kernels, device, model_dtype, config.platform.native_kernels)
    logger.info("kernel set for %s on %s: %s", model_dtype, device, kernels.describe())
    return PlatformPlan(
        device=device,
        dtype=dtype,
        bf16_matmuls=bf16,
        packed_activations=packed_activations(
            config.platform.packed_activations, config.platform.fp32_precision, measured
        ),
        kv_dtype=kv_cache_dtype(config.kv_cache_dtype, model_dtype, bf16, tensor_parallel),
        kv_cache_dtype=config.kv_cache_dtype,
        host_malloc=malloc,
        threads=StepThreads(config.platform.front_end_core, host and not tensor_parallel),
        kernels=kernels,
        linear_paths=config.platform.fast_linear and host,
        mask_kernel=bitmask_kernel() if host else None,
    )


KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def kv_cache_dtype(
    requested: str, model_dtype: torch.dtype, bf16_arithmetic: bool, tensor_parallel: bool
) -> torch.dtype:
    """The KV pool's dtype: `auto` is bf16 for an fp32 model allowed bf16 arithmetic (`fp32_precision`; decode
    attention then reads half the bytes, at the precision bf16 engines keep K/V in: on the AMX Xeon the
    engine benchmark's (b) 443.0 -> 491.5 tok/s, (c) 338.9 -> 388.5, (d) 286.5 -> 329.2) and the model's
    dtype otherwise. An explicit dtype is taken as given (a bf16 pool under an fp32 model also holds twice
    the tokens in the same memory), except across tensor-parallel ranks, whose pools are the model's dtype."""
    if requested not in KV_CACHE_DTYPES:
        raise ConfigError(
            f"engine option kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {requested!r}"
        )
    if requested == "auto":
        return torch.bfloat16 if model_dtype == torch.float32 and bf16_arithmetic else model_dtype
    dtype = getattr(torch, requested)
    if tensor_parallel and dtype != model_dtype:
        raise ConfigError(
            f"kv_cache_dtype {requested} with tensor parallel: the ranks keep K/V in the model's dtype "
            f"({str(model_dtype).removeprefix('torch.')}); leave kv_cache_dtype auto"
        )
    return dtype
