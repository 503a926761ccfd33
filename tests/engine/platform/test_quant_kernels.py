"""The quantized linear kernels against torch: dequantize (the format reference) then matmul.

Every instruction-set variant (`isa.VARIANTS`) whose flags the CPU has is built and run, with its widest code
path and its scalar one; a variant the CPU lacks the flags for is skipped naming the flags.
Tolerance: the float paths sum fp32 products in another order than torch's matmul and fuse q * d + m into
one rounding, so outputs agree to 2e-5 of the largest output magnitude (measured: ~1e-6); the integer paths
round each activation to int16 within its block of 32 (at most 1/65534 of the block's largest), so they
agree to 1e-4 (measured: ~2e-5); the bf16 paths (AMX) round each weight and activation to bf16 (2^-9 of
its value), so they agree to 1e-2 (measured: ~3e-3); the int8-activation paths (AVX-512 VNNI, vpdpbusd) round
each activation to int8 within its block (1/254 of the block's largest), so they are held to a matmul on
activations rounded that way, to 1e-4 (with the activations as they are they agree to ~5e-3).
The 5-bit and K-quant blocks (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): Q5_0's tiled copy is a Q8_0 one, so its
integer paths are Q8_0's (same tolerances); the others have no tiled copy, every code path runs its float path
on them, held to the float tolerance. Their random blocks come from `tests.gguf_files` (the `gguf` package
dequantizes them but does not quantize to them).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vriksha.engine.platform.native import isa
from vriksha.engine.platform.native.quant import (
    BF16_PATHS,
    FLOAT_PATHS,
    INT8_PATHS,
    TILED_PATHS,
    QuantKernelError,
    missing_flags,
    quant_kernels,
)
from vriksha.errors import ModelLoadError
from vriksha.loading.packed import BLOCK_WEIGHTS, PackedWeight, dequantize, quantize_int8

gguf_quants = pytest.importorskip("gguf.quants")
BLOCK_FORMATS = ["q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
UNTILED = ["q5_1", "q4_k", "q5_k", "q6_k"]  # served on their float paths alone
GGML_TYPES = {q: q.upper() for q in ["q4_0", "q4_1", "q8_0", *BLOCK_FORMATS]}
RTOL = 2e-5
RTOL_INT = 1e-4
RTOL_BF16 = 1e-2


def rtol(path: str) -> float:
    return RTOL if path in FLOAT_PATHS else RTOL_BF16 if path in BF16_PATHS else RTOL_INT


def rounded_as(path: str, qtype: str, x: torch.Tensor) -> torch.Tensor:
    """`x` as code path `path` sees it on a `qtype` weight: on an int8-activation path with GGUF blocks, each
    block of 32 rounded to int8 (dx = max|x| / 127, to nearest even); otherwise as it is."""
    if path not in INT8_PATHS or qtype == "int8":
        return x
    blocks = x.reshape(x.shape[0], -1, 32)
    top = blocks.abs().amax(-1, keepdim=True)
    scale = torch.where(top > 0, torch.tensor(127.0) / top, torch.zeros_like(top))
    return (torch.round(blocks * scale) * (top / 127.0)).reshape(x.shape)


def out_features(path: str) -> int:
    """An output count no row tile divides, or for a tiled path (16 rows a tile) one no wider tile does."""
    return 80 if path in TILED_PATHS else 67  # 80: five tiles of 16 rows, ten of 8


@pytest.fixture(scope="module")
def kernels():
    k = quant_kernels()
    if k is None:
        pytest.skip("no C compiler: the quantized kernels cannot be built")
    return k


def packed_random(qtype: str, out_f: int, in_f: int, seed: int = 0) -> PackedWeight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * 0.05
    if qtype == "int8":
        return quantize_int8(w)
    if qtype in BLOCK_FORMATS:
        from tests.gguf_files import random_blocks

        raw = random_blocks(GGML_TYPES[qtype], out_f, in_f // BLOCK_WEIGHTS[qtype], seed=seed)
        return PackedWeight(qtype, torch.from_numpy(raw), out_f, in_f)
    from gguf import GGMLQuantizationType

    raw = gguf_quants.quantize(w.numpy(), getattr(GGMLQuantizationType, GGML_TYPES[qtype]))
    return PackedWeight(qtype, torch.from_numpy(np.ascontiguousarray(raw)), out_f, in_f)


def built(variant: str):
    missing = missing_flags(isa.variant(variant))
    if missing:
        pytest.skip(f"needs {' '.join(missing)}")
    k = quant_kernels(variant)
    if k is None:
        pytest.skip("no C compiler: the quantized kernels cannot be built")
    return k


VARIANTS = [v.name for v in isa.VARIANTS]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_tiled_path_refuses_rows_it_cannot_tile(variant):
    k = built(variant)
    for path in set(k.paths) & set(TILED_PATHS):
        rows = TILED_PATHS[path]
        p = packed_random("q4_1", 67, 64)
        assert not k.runs(p, path)
        with pytest.raises(QuantKernelError, match=f"multiple of {rows} output rows"):
            k.linear(torch.randn(1, 64), p, path=path)
        assert not p.tiled
        q = packed_random("q4_1", 32, 64)
        k.linear(torch.randn(1, 64), q, path=path)
        (tiled,) = q.tiled.values()
        assert tiled.numel() == 32 * 64 // 32 * 20  # the same bytes as the rows, reordered


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
def test_torch_dequantize_equals_the_gguf_reference(qtype):
    from gguf import GGMLQuantizationType

    p = packed_random(qtype, 24, 96)
    ref = gguf_quants.dequantize(p.data.numpy(), getattr(GGMLQuantizationType, GGML_TYPES[qtype]))
    assert torch.equal(dequantize(p), torch.from_numpy(ref.reshape(24, 96)))


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0", "int8"])
def test_native_dequantize_is_exact(kernels, qtype):
    p = packed_random(qtype, 40, 128)
    assert torch.equal(kernels.dequantize(p), dequantize(p))
    assert torch.equal(kernels.dequantize(p, 7, 5), dequantize(p)[7:12])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0", "int8"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 16, 40])
def test_linear_matches_dequantize_then_matmul(variant, qtype, rows):
    k = built(variant)
    for path in k.paths:
        out_f, in_f = out_features(path), 192
        p = packed_random(qtype, out_f, in_f, seed=rows)
        g = torch.Generator().manual_seed(100 + rows)
        x = torch.randn(rows, in_f, generator=g)
        bias = torch.randn(out_f, generator=g)
        ref = rounded_as(path, qtype, x) @ dequantize(p).T + bias
        y = k.linear(x, p, bias, path=path)
        assert y.shape == ref.shape
        assert (y - ref).abs().max() <= rtol(path) * ref.abs().max(), path
        assert torch.allclose(k.linear(x, p, None, path=path), ref - bias, atol=rtol(path) * ref.abs().max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "int8", "q4_k", "q5_0"])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_bf16_linear_is_the_fp32_sum_rounded_once(variant, qtype, rows):
    """bf16 activations are widened exactly, so the bf16 entry is the fp32 kernel on the same values with each
    output (bias added in fp32) rounded once to bf16."""
    k = built(variant)
    for path in k.paths:
        out_f, in_f = out_features(path), 512 if qtype == "q4_k" else 192
        p = packed_random(qtype, out_f, in_f, seed=rows)
        g = torch.Generator().manual_seed(200 + rows)
        x = torch.randn(rows, in_f, generator=g).bfloat16()
        bias = torch.randn(out_f, generator=g).bfloat16()
        y = k.linear(x, p, bias, path=path)
        assert y.dtype == torch.bfloat16 and y.shape == (rows, out_f)
        want = (k.linear(x.float(), p, bias.float(), path=path)).bfloat16()
        ulp = want.float().abs() * 2**-7  # fp32 bias added inside vs after: at most one bf16 step apart
        assert ((y.float() - want.float()).abs() <= ulp + 1e-6).all(), path
        assert torch.equal(
            k.linear(x, p, None, path=path), k.linear(x.float(), p, None, path=path).bfloat16()
        )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype", BLOCK_FORMATS)
def test_block_formats_dequantize_to_the_gguf_reference(variant, qtype):
    """The torch reference (`ggml_blocks`) and every build's native dequantizer give the `gguf` package's
    values, bit for bit (no product and sum fused into one rounding)."""
    from gguf import GGMLQuantizationType

    kernels = built(variant)

    in_f = 512 if qtype.endswith("_k") else 96
    p = packed_random(qtype, 24, in_f, seed=3)
    ref = gguf_quants.dequantize(p.data.numpy(), getattr(GGMLQuantizationType, GGML_TYPES[qtype]))
    want = torch.from_numpy(ref.reshape(24, in_f))
    assert torch.equal(dequantize(p), want)
    assert torch.equal(kernels.dequantize(p), want)
    assert torch.equal(kernels.dequantize(p, 7, 5), want[7:12])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype", BLOCK_FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 40])
def test_block_formats_match_dequantize_then_matmul(variant, qtype, rows):
    """Every code path of every variant (the integer and bf16 ones hand the untiled formats to their float
    path, on rows no tile divides), of two widths: two super-blocks and several (the 5-bit blocks: three
    blocks, not a multiple of 256, and several)."""
    k = built(variant)
    widths = (512, 2304) if qtype.endswith("_k") else (96, 2240)
    for in_f in widths:
        for path in k.paths:
            out_f = out_features(path) if qtype == "q5_0" else 67
            p = packed_random(qtype, out_f, in_f, seed=rows)
            g = torch.Generator().manual_seed(300 + rows)
            x = torch.randn(rows, in_f, generator=g)
            bias = torch.randn(out_f, generator=g)
            seen = rounded_as(path, qtype, x) if qtype == "q5_0" else x  # the others: float paths
            ref = seen @ dequantize(p).T + bias
            assert k.runs(p, path)
            y = k.linear(x, p, bias, path=path)
            tol = rtol(path) if qtype == "q5_0" else RTOL
            assert (y - ref).abs().max() <= tol * ref.abs().max(), (path, in_f)
            assert bool(p.tiled) is (qtype == "q5_0" and path in TILED_PATHS)


def test_block_formats_are_timed_on_their_float_path_alone(kernels):
    from vriksha.engine.platform.packed_linear import candidate_paths

    widest_float = [p for p in kernels.paths if p in FLOAT_PATHS][-1]
    for qtype in UNTILED:
        assert candidate_paths(kernels, qtype, bf16=True, activations="int8") == [widest_float]
    assert candidate_paths(kernels, "q5_0", activations="int8") == candidate_paths(
        kernels, "q8_0", activations="int8"
    )


def test_q5_0_tiles_as_q8_0(kernels):
    """Q5_0's tiled copy is the Q8_0 copy of the same weights (d, and each code less 16 as an int8)."""
    from vriksha.engine.platform.native.quant import TILED_PATHS as tiled_paths

    p = packed_random("q5_0", 32, 96, seed=5)
    blocks = p.data.view(32, 3, 22)
    codes = torch.round(
        dequantize(p).view(32, 3, 32) / blocks[..., :2].contiguous().view(torch.float16).float()
    )
    q8 = torch.cat([blocks[..., :2], codes.to(torch.int8).view(torch.uint8)], dim=-1).reshape(32, -1)
    as_q8 = PackedWeight("q8_0", q8.contiguous(), 32, 96)
    assert torch.equal(dequantize(as_q8), dequantize(p))
    for path in set(kernels.paths) & set(tiled_paths):
        kernels.pointer(p, path)
        kernels.pointer(as_q8, path)
        assert p.tiled.keys() == as_q8.tiled.keys()
        assert all(torch.equal(p.tiled[key], as_q8.tiled[key]) for key in p.tiled), path


def test_packed_kernels_refuse_other_dtypes(kernels):
    p = packed_random("q8_0", 8, 64)
    with pytest.raises(QuantKernelError, match="float32 or bfloat16"):
        kernels.linear(torch.randn(2, 64, dtype=torch.float16), p)
    with pytest.raises(QuantKernelError, match="bias of the same dtype"):
        kernels.linear(torch.randn(2, 64).bfloat16(), p, torch.zeros(8))


@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_rows_of_any_width(variant):
    """int8 rows need not be whole blocks (any Transformers model): the tail is summed in scalar."""
    k = built(variant)
    p = packed_random("int8", 33, 70)
    x = torch.randn(3, 70)
    ref = x @ dequantize(p).T
    for path in k.paths:  # the integer paths hand int8 rows to their float path
        assert (k.linear(x, p, path=path) - ref).abs().max() <= RTOL * ref.abs().max(), path


def test_each_variant_has_its_widest_path():
    expect = {"generic": "scalar", "avx2": "avx2_i16", "avx512": "avx2_i16", "avx512_bf16": "avx512_vnni"}
    for name in VARIANTS:
        if not missing_flags(isa.variant(name)) and (k := quant_kernels(name)) is not None:
            assert k.variant == expect[name], name


def test_int8_quantization_error_is_bounded():
    w = torch.randn(64, 256)
    p = quantize_int8(w)
    err = (dequantize(p) - w).abs()
    assert (err <= p.scale[:, None] / 2 + 1e-7).all()  # round to nearest: at most half a step per weight


def test_bad_packed_shapes_are_refused():
    with pytest.raises(ModelLoadError, match="multiple of 32"):
        PackedWeight("q4_1", torch.zeros(4, 20, dtype=torch.uint8), 4, 40)
    with pytest.raises(ModelLoadError, match="contiguous"):
        PackedWeight("q8_0", torch.zeros(4, 33, dtype=torch.uint8), 4, 32)
    with pytest.raises(ModelLoadError, match="unknown packed weight type"):
        PackedWeight("q2_k", torch.zeros(4, 4, dtype=torch.uint8), 4, 32)
    with pytest.raises(ModelLoadError, match="q6_k rows need a multiple of 256 inputs, got 96"):
        PackedWeight("q6_k", torch.zeros(4, 0, dtype=torch.uint8), 4, 96)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_compiles_here(variant):
    """The wider variants are at least compiled on a machine that cannot run them."""
    from vriksha.engine.platform.native import _compiler
    from vriksha.engine.platform.native.quant import build_variant

    compiler = _compiler()
    if compiler is None or not isa.is_x86():
        pytest.skip("needs a C compiler for x86")
    assert build_variant(compiler, isa.variant(variant)).is_file()


def test_the_amx_and_int8_paths_are_listed_where_the_cpu_has_them_and_only_timed_where_allowed():
    from vriksha.engine.platform.cpu_features import cpu_features
    from vriksha.engine.platform.packed_linear import candidate_paths

    if missing_flags(isa.variant("avx512_bf16")) or (k := quant_kernels("avx512_bf16")) is None:
        pytest.skip(
            "needs the avx512_bf16 build's flags: " + ", ".join(missing_flags(isa.variant("avx512_bf16")))
        )
    has_amx = cpu_features().has("amx_bf16") and cpu_features().has("amx_tile")
    assert ("amx_bf16" in k.paths) is has_amx
    assert k.variant == "avx512_vnni"  # never the default: it rounds to bf16
    assert not set(candidate_paths(k, "q4_1")) & set(BF16_PATHS + INT8_PATHS)
    assert "avx512_vnni_i8" in candidate_paths(k, "q4_1", activations="int8")
    assert "avx512_vnni_i8" not in candidate_paths(k, "int8", activations="int8")
    assert ("amx_bf16" in candidate_paths(k, "q4_1", bf16=True)) is has_amx
    assert "amx_bf16" not in candidate_paths(k, "int8", bf16=True)
    if not has_amx:
        pytest.skip("needs amx_bf16 and amx_tile for the rest")
    # 20 rows: one pass of up to four row tiles; 150 and 70: more than one pass of 64 rows, the last partial
    for qtype, out, rows in (("q4_1", 32, 20), ("q4_1", 48, 150), ("q8_0", 32, 150), ("q4_0", 16, 70)):
        p = packed_random(qtype, out, 96)
        x = torch.randn(rows, 96)
        y = k.linear(x, p, path="amx_bf16")  # a bf16 copy of both sides, fp32 sums: what the path computes
        want = x.bfloat16().float() @ dequantize(p).bfloat16().float().T
        assert (y - want).abs().max() <= 1e-5 * want.abs().max(), (qtype, out, rows)
