"""Whether an fp32 engine's CPU matmuls may run in bf16 arithmetic, and the switch that makes one do so.

oneDNN can compute an fp32 matmul with bf16 multiplies and fp32 sums (its "fpmath mode", torch's
`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`), on AMX tiles or AVX512-BF16 instructions, with
no bf16 copy of the weight. On such CPUs a prefill-sized fp32 matmul runs about three times faster that
way; a decode-sized one often does not. The engine's linear-path choosers (`dense_linear.py`, `packed_linear.py`)
time the bf16 path beside the fp32 ones per layer shape and batch size and take it only where it measured
faster. The torch setting is process-wide, so each routed call sets it around its own matmul and puts the
previous value back: training forwards and every other matmul keep theirs.

`fp32_precision` (an engine option): `ieee` keeps strict fp32 matmuls; `bf16` lets the choosers take bf16
arithmetic where it measures faster; `auto` is `bf16` when the engine's dtype came from `dtype="auto"`
(the fastest measured, within the precision bf16 engines already run at) and `ieee` for an explicit
`--dtype float32`, a dtype pinned by `$VRIKSHA_DTYPE` (the test suite's fp32 references) or an engine
around a module it was handed (the trainer's colocated rollouts).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from vriksha.engine.platform.cpu_features import cpu_features
from vriksha.errors import ConfigError

MODES = ("auto", "ieee", "bf16")
CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # oneDNN runs bf16 arithmetic natively with one of these


@functools.cache
def supported() -> bool:
    """Whether this CPU and torch build run fp32 matmuls in bf16 arithmetic natively: the CPU has the flags
    and one small matmul in that mode really rounds (oneDNN keeps strict fp32 where its ISA is capped, as
    `ONEDNN_MAX_CPU_ISA=AVX2` does)."""
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    if not (
        torch.backends.mkldnn.is_available()
        and matmul is not None
        and hasattr(matmul, "fp32_precision")
        and any(cpu_features().has(flag) for flag in CPU_FLAGS)
    ):
        return False
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 256, generator=generator), torch.randn(64, 256, generator=generator)
    with torch.inference_mode():
        return not torch.equal(bf16_linear(x, w), F.linear(x, w))


def bf16_precision_allowed(requested: str, dtype_measured: bool) -> bool:
    """Whether `fp32_precision` lets the engine run at a bf16 engine's precision (what bf16 arithmetic and
    the packed kernels' int8 activations both need): bf16, or auto with the dtype from `dtype="auto"`'s
    measurement (not given or pinned)."""
    if requested not in MODES:
        raise ConfigError(
            f"engine option fp32_precision must be one of {', '.join(MODES)}, got {requested!r}"
        )
    return requested == "bf16" or (requested == "auto" and dtype_measured)


def resolve(requested: str, dtype: torch.dtype, dtype_measured: bool, cpu: bool) -> bool:
    """Whether the engine's linear-path choosers may time and take the bf16 path for its fp32 linear layers."""
    allowed = bf16_precision_allowed(requested, dtype_measured)
    return allowed and dtype == torch.float32 and cpu and supported()


@contextlib.contextmanager
def bf16_arithmetic() -> Iterator[None]:
    """fp32 matmuls issued inside this block run with bf16 multiplies and fp32 sums (oneDNN's fpmath mode)."""
    matmul = torch.backends.mkldnn.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = previous


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` of fp32 tensors in bf16 arithmetic."""
    with bf16_arithmetic():
        return F.linear(x, weight, bias)


def describe(allowed: bool) -> str:
    if allowed:
        return "fp32 matmuls in bf16 arithmetic where measured faster (oneDNN fpmath)"
    return "strict fp32 matmuls"
