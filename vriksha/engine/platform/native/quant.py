"""The quantized linear kernels (`quant_kernels.c`): packed weights dequantized in registers.

Built like the fp32 kernels, once per instruction-set variant (`isa.py`; the AVX2 and AVX-512 builds add
F16C, which every CPU with AVX2 has, the AVX512-BF16 build adds AVX-512 VNNI), and the widest variant this
CPU's flags allow is loaded. Inside a build, `paths` lists its code paths (`scalar` always, `avx2`, `avx512`,
`avx2_i16`, `avx512_vnni`, and the opt-in `avx2_i8`, `avx512_vnni_i8` and `amx_bf16`): the widest of the
first five runs unless a path is named, the scalar one is the reference the tests hold the others to.
`avx2` and `avx512` sum fp32 products of the dequantized weights with the activations as they are; the
integer paths round each block of 32 activations to int16 (at most 1/65534 of the block's largest) and dot it
with the weights widened to int16, on a copy of the weight tiled 8 (`avx2_i16`, vpmaddwd) or 16
(`avx512_vnni`, vpdpwssd) output rows at a time, made once on first use, where one instruction advances every
row's dot product by two elements: decode is bound by reading the weights rather than by decoding them.
`avx2_i8` and `avx512_vnni_i8` round the activations to int8 instead and, on a copy tiled in quads, advance
each row by four elements an instruction (vpmaddubsw, vpdpbusd); they are timed only where the engine allows
int8 activations."""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from vriksha.engine.platform.native import build, isa, load_variant
from vriksha.errors import VrikshaError
from vriksha.loading.packed import PackedWeight
from vriksha.profiling.annotate import native_call

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant_kernels.c")
HEADERS = (SOURCE.with_name("amx.h"), SOURCE.with_name("kquant.h"))
# the bits of vq_variants(), in order of preference: the widest a build has runs
PATHS = {
    "scalar": 1,
    "avx2": 2,
    "avx512": 4,
    "avx2_i16": 16,
    "avx2_i8": 128,
    "avx512_vnni": 8,
    "avx512_vnni_i8": 64,
    "amx_bf16": 32,
}
# the float paths take fp32 products of the activations as they are; the others round them to int16
FLOAT_PATHS = ("scalar", "avx2", "avx512")
# read a copy of the weight tiled so many rows at a time
TILED_PATHS = {"avx2_i16": 8, "avx2_i8": 8, "avx512_vnni": 16, "avx512_vnni_i8": 16, "amx_bf16": 16}
# bf16 arithmetic (weights and activations rounded to bf16, fp32 sums): only where the engine allows it
BF16_PATHS = ("amx_bf16",)
# int8 activations (each block of 32 rounded to 1/254 of its largest, llama.cpp's Q8 numerics): only where the
# engine allows it; they read a tiled copy laid out in quads rather than in pairs
INT8_PATHS = ("avx2_i8", "avx512_vnni_i8")
KINDS = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "int8": 3, "q5_0": 4, "q5_1": 5, "q4_k": 6, "q5_k": 7, "q6_k": 8}
# the formats with a tiled copy and integer paths (Q5_0's copy is a Q8_0 one: the same d, each code less 16 as
# an int8); the others (int8 rows, Q5_1 and the K-quant blocks) run their float path on every code path
TILED_KINDS = ("q4_0", "q4_1", "q8_0", "q5_0")
_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


class QuantKernelError(VrikshaError):
    """A quantized kernel refused its arguments."""


class QuantKernels:
    """Typed entry points; activations fp32 or bf16 on the CPU. `variant` is the fastest one this build has."""

    DTYPES = (torch.float32, torch.bfloat16)

    def __init__(self, path: Path, variant: isa.Variant) -> None:
        lib = ctypes.CDLL(str(path))
        lib.vq_variants.restype = _INT
        lib.vq_linear.argtypes = [_INT, _INT] + [_PTR] * 5 + [_I64] * 3 + [_INT]
        lib.vq_linear.restype = _INT
        lib.vq_linear_bf16.argtypes = [_INT, _INT] + [_PTR] * 6 + [_I64] * 3 + [_INT]
        lib.vq_linear_bf16.restype = _INT
        lib.vq_dequantize.argtypes = [_INT] + [_PTR] * 3 + [_I64] * 3
        lib.vq_dequantize.restype = _INT
        lib.vq_tile.argtypes = [_INT, _I64, _INT, _PTR, _PTR, _I64, _I64]
        lib.vq_tile.restype = _INT
        lib.vq_tile_bytes.argtypes = [_INT, _I64, _I64, _I64]
        lib.vq_tile_bytes.restype = _I64
        self._lib = lib
        self.path = path
        self.isa = variant
        bits = lib.vq_variants()
        self.paths = [name for name, bit in PATHS.items() if bits & bit]
        # the code path that runs unless one is named: the widest that keeps fp32 activations or int16 ones
        self.variant = [p for p in self.paths if p not in BF16_PATHS + INT8_PATHS][-1]

    def linear(
        self,
        x: torch.Tensor,
        weight: PackedWeight,
        bias: torch.Tensor | None = None,
        path: str | None = None,
    ) -> torch.Tensor:
        """x [M, in] (fp32 or bf16, contiguous) @ dequantize(weight).T (+ bias, x's dtype) -> [M, out] in x's
        dtype, summed in fp32 either way; `path`: a code path of this build (default: the widest)."""
        if x.dtype not in self.DTYPES or (bias is not None and bias.dtype != x.dtype):
            raise QuantKernelError(
                f"packed kernels take float32 or bfloat16 activations with a bias of the same dtype, got "
                f"{x.dtype}{'' if bias is None else f' and a {bias.dtype} bias'}"
            )
        rows = x.shape[0]
        y = torch.empty(rows, weight.out_features, dtype=x.dtype)
        path = path or self.variant
        head = (
            PATHS[path],
            KINDS[weight.qtype],
            self.pointer(weight, path),
            weight.scale.data_ptr() if weight.scale is not None else None,
            bias.data_ptr() if bias is not None else None,
            x.data_ptr(),
            y.data_ptr(),
        )
        shape = (weight.out_features, weight.in_features, rows, torch.get_num_threads())
        if x.dtype == torch.float32:
            done = native_call(self._lib.vq_linear, "packed_linear")(*head, *shape)
        else:
            work = torch.empty(rows * (weight.in_features + weight.out_features), dtype=torch.float32)
            done = native_call(self._lib.vq_linear_bf16, "packed_linear")(*head, work.data_ptr(), *shape)
        if done != 0:
            raise QuantKernelError(
                f"the {path} kernel cannot run a {weight.qtype} weight "
                f"[{weight.out_features} x {weight.in_features}]; this build's paths: {self.paths}"
            )
        return y

    def runs(self, weight: PackedWeight, path: str) -> bool:
        """Whether code path `path` of this build serves `weight` (a tiled path needs whole tiles of rows)."""
        if path not in self.paths:
            return False
        return (
            path not in TILED_PATHS
            or weight.qtype not in TILED_KINDS
            or weight.out_features % TILED_PATHS[path] == 0
        )

    def pointer(self, weight: PackedWeight, path: str) -> int:
        """The address of the bytes `path` reads for `weight`: its tiled copy on a tiled path (made on first
        use and kept with the weight), else its packed rows."""
        if path not in TILED_PATHS or weight.qtype not in TILED_KINDS:
            return weight.data.data_ptr()
        rows, quads = TILED_PATHS[path], path in INT8_PATHS
        layout = (rows, "quads" if quads else "pairs")
        if layout not in weight.tiled:
            kind = KINDS[weight.qtype]
            size = self._lib.vq_tile_bytes(kind, rows, weight.out_features, weight.in_features)
            if size < 0:
                raise QuantKernelError(
                    f"the {path} kernel needs a multiple of {rows} output rows, this {weight.qtype} "
                    f"weight has {weight.out_features}"
                )
            tiled = torch.empty(size, dtype=torch.uint8)
            self._lib.vq_tile(
                kind,
                rows,
                int(quads),
                weight.data.data_ptr(),
                tiled.data_ptr(),
                weight.out_features,
                weight.in_features,
            )
            weight.tiled[layout] = tiled
        return weight.tiled[layout].data_ptr()

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


def _extra(variant: isa.Variant) -> dict[str, str]:
    """Flags the quantized build adds to `variant`'s: F16C with AVX2 (every AVX2 CPU has it), and AVX-512 VNNI
    with AVX512-BF16 (every CPU with BF16 has VNNI; the `vnni` path needs it), as {cflag: cpu flag}."""
    extra = {"-mf16c": "f16c"} if "-mavx2" in variant.cflags else {}
    if "-mavx512bf16" in variant.cflags:
        extra["-mavx512vnni"] = "avx512_vnni"
    return extra


def build_variant(compiler: str, variant: isa.Variant) -> Path:
    """The quantized kernels' library of `variant` (compiles whether or not this CPU runs it)."""
    return build(compiler, variant, (SOURCE,), HEADERS, "quant_kernels", tuple(_extra(variant)))


def missing_flags(variant: isa.Variant) -> list[str]:
    """The CPU flags the quantized build of `variant` needs that this CPU lacks."""
    need = set(variant.cpu_flags) | set(_extra(variant).values())
    return sorted(need - isa.cpu_flags())
