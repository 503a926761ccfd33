"""The quantized linear kernels (`quant_kernels.c`): packed weights dequantized in registers, one variant per
instruction set the compiler targets on this CPU, built and cached like the fp32 kernels."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from vriksha.engine.native import _build, _compiler
from vriksha.errors import VrikshaError
from vriksha.loading.packed import PackedWeight

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant_kernels.c")
VARIANTS = {"scalar": 1, "avx2": 2, "avx512": 4}  # the bits of vq_variants()
CPU_FLAGS = {"avx2": ("avx2", "fma", "f16c"), "avx512": ("avx512f",)}  # what each variant needs
_KINDS = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "int8": 3}
_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


class QuantKernelError(VrikshaError):
    """A quantized kernel refused its arguments."""


class QuantKernels:
    """Typed entry points; activations fp32 on the CPU. `variant` is the fastest one this build has."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.vq_variants.restype = _INT
        lib.vq_linear.argtypes = [_INT, _INT] + [_PTR] * 5 + [_I64] * 3 + [_INT]
        lib.vq_linear.restype = _INT
        lib.vq_dequantize.argtypes = [_INT] + [_PTR] * 3 + [_I64] * 3
        lib.vq_dequantize.restype = _INT
        self._lib = lib
        self.path = path
        bits = lib.vq_variants()
        self.variants = [name for name, bit in VARIANTS.items() if bits & bit]
        self.variant = self.variants[-1]

    def linear(
        self,
        x: torch.Tensor,
        weight: PackedWeight,
        bias: torch.Tensor | None = None,
        variant: str | None = None,
    ) -> torch.Tensor:
        """x [M, in] (fp32, contiguous) @ dequantize(weight).T (+ bias) -> [M, out]."""
        rows = x.shape[0]
        y = torch.empty(rows, weight.out_features, dtype=torch.float32)
        done = self._lib.vq_linear(
            VARIANTS[variant or self.variant],
            _KINDS[weight.qtype],
            weight.data.data_ptr(),
            weight.scale.data_ptr() if weight.scale is not None else None,
            bias.data_ptr() if bias is not None else None,
            x.data_ptr(),
            y.data_ptr(),
            weight.out_features,
            weight.in_features,
            rows,
            torch.get_num_threads(),
        )
        if done != 0:
            raise QuantKernelError(
                f"the {variant or self.variant} kernel cannot run a {weight.qtype} weight "
                f"[{weight.out_features} x {weight.in_features}]; available variants: {self.variants}"
            )
        return y

    def dequantize(self, weight: PackedWeight, row0: int = 0, rows: int | None = None) -> torch.Tensor:
        """Rows [row0, row0 + rows) of the weight in fp32."""
        rows = weight.out_features - row0 if rows is None else rows
        out = torch.empty(rows, weight.in_features, dtype=torch.float32)
        self._lib.vq_dequantize(
            _KINDS[weight.qtype],
            weight.data.data_ptr(),
            weight.scale.data_ptr() if weight.scale is not None else None,
            out.data_ptr(),
            row0,
            rows,
            weight.in_features,
        )
        return out


def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def missing_flags(variant: str) -> list[str]:
    """The CPU flags `variant` needs that this CPU lacks."""
    have = cpu_flags()
    return [f for f in CPU_FLAGS.get(variant, ()) if f not in have]


@functools.cache
def quant_kernels() -> QuantKernels | None:
    """The quantized kernels, built on first call; None without a C compiler or with VRIKSHA_NATIVE=0."""
    if os.environ.get("VRIKSHA_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found (set CC): packed weights cannot be served")
        return None
    try:
        return QuantKernels(_build(compiler, SOURCE))
    except (OSError, RuntimeError) as exc:
        logger.warning("quantized CPU kernels unavailable: %s", exc)
        return None
