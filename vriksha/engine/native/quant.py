"""The quantized linear kernels (`quant_kernels.c`): packed weights dequantized in registers.

Built like the fp32 kernels, once per instruction-set variant (`isa.py`; the AVX2 and AVX-512 builds add
F16C, which every CPU with AVX2 has), and the widest variant this CPU's flags allow is loaded. Inside a
build, `paths` lists its code paths (`scalar` always, `avx2`, `avx512`): the widest runs, the scalar one is the
reference the tests hold the others to."""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from vriksha.engine.native import build, isa, load_variant
from vriksha.errors import VrikshaError
from vriksha.loading.packed import PackedWeight

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant_kernels.c")
PATHS = {"scalar": 1, "avx2": 2, "avx512": 4}  # the bits of vq_variants()
KINDS = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "int8": 3}
_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


class QuantKernelError(VrikshaError):
    """A quantized kernel refused its arguments."""


class QuantKernels:
    """Typed entry points; activations fp32 on the CPU. `variant` is the fastest one this build has."""

    def __init__(self, path: Path, variant: isa.Variant) -> None:
        lib = ctypes.CDLL(str(path))
        lib.vq_variants.restype = _INT
        lib.vq_linear.argtypes = [_INT, _INT] + [_PTR] * 5 + [_I64] * 3 + [_INT]
        lib.vq_linear.restype = _INT
        lib.vq_dequantize.argtypes = [_INT] + [_PTR] * 3 + [_I64] * 3
        lib.vq_dequantize.restype = _INT
        self._lib = lib
        self.path = path
        self.isa = variant
        bits = lib.vq_variants()
        self.paths = [name for name, bit in PATHS.items() if bits & bit]
        self.variant = self.paths[-1]  # the code path that runs

    def linear(
        self,
        x: torch.Tensor,
        weight: PackedWeight,
        bias: torch.Tensor | None = None,
        path: str | None = None,
    ) -> torch.Tensor:
        """x [M, in] (fp32, contiguous) @ dequantize(weight).T (+ bias) -> [M, out]; `path`: a code path of
        this build (default: the widest)."""
        rows = x.shape[0]
        y = torch.empty(rows, weight.out_features, dtype=torch.float32)
        done = self._lib.vq_linear(
            PATHS[path or self.variant],
            KINDS[weight.qtype],
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
                f"the {path or self.variant} kernel cannot run a {weight.qtype} weight "
                f"[{weight.out_features} x {weight.in_features}]; this build's paths: {self.paths}"
            )
        return y

    def dequantize(self, weight: PackedWeight, row0: int = 0, rows: int | None = None) -> torch.Tensor:
        """Rows [row0, row0 + rows) of the weight in fp32."""
        rows = weight.out_features - row0 if rows is None else rows
        out = torch.empty(rows, weight.in_features, dtype=torch.float32)
        self._lib.vq_dequantize(
            KINDS[weight.qtype],
            weight.data.data_ptr(),
            weight.scale.data_ptr() if weight.scale is not None else None,
            out.data_ptr(),
            row0,
            rows,
            weight.in_features,
        )
        return out


@functools.cache
def quant_kernels(variant: str | None = None) -> QuantKernels | None:
    """The quantized kernels of `variant` (default: the widest this CPU runs), built on first call; None
    without a C compiler, with VRIKSHA_NATIVE=0, or where the CPU lacks the variant's flags."""
    loaded = load_variant(
        variant,
        build_variant,
        "packed weights cannot be served",
        runnable=lambda v: isa.runnable(v) and not missing_flags(v),
    )
    return QuantKernels(*loaded) if loaded else None


def build_variant(compiler: str, variant: isa.Variant) -> Path:
    """The quantized kernels' library of `variant` (compiles whether or not this CPU runs it)."""
    extra = ("-mf16c",) if "-mavx2" in variant.cflags else ()
    return build(compiler, variant, (SOURCE,), (), "quant_kernels", extra)


def missing_flags(variant: isa.Variant) -> list[str]:
    """The CPU flags the quantized build of `variant` needs that this CPU lacks."""
    need = set(variant.cpu_flags) | ({"f16c"} if "-mavx2" in variant.cflags else set())
    return sorted(need - isa.cpu_flags())
