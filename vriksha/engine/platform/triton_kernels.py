"""The Triton kernel set: decode attention over the KV pool in place, RMSNorm (residual add fused), SiLU
gating and rotary embedding, as @triton.jit kernels for any device Triton compiles for.

Importing this module imports triton; `kernel_sets` registers the set without importing it and loads it
only when the set is chosen. Every kernel reads fp16, bf16 or fp32 and sums in float32; the elementwise
kernels round where torch's ops of the same dtype round. With `TRITON_INTERPRET=1` (set before triton is
imported) the kernels run on CPU tensors through Triton's interpreter, which is how they are tested on a
machine without a GPU (tests/engine/platform/test_triton_kernels.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from vriksha.engine.platform.kernel_sets import TorchKernels

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCORE_TILE = 4096  # float32 products per step of the decode loop (group x positions x head lanes)


@triton.jit
def _decode_attention_kernel(
    q_ptr,  # [B, H, D]
    k_ptr,  # [S, Hkv, D]
    v_ptr,  # [S, Hkv, Dv]
    slots_ptr,  # [B, Lmax] int64
    lens_ptr,  # [B] int64
    out_ptr,  # [B, H, Dv] float32
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_sb,
    stride_ob,
    stride_oh,
    scale,
    window,  # 0: the whole context
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per (request, KV head): every query head of the group reads each key and value row of
    the request's slots once; online softmax in float32."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    length = tl.load(lens_ptr + b)
    lo = tl.where(window > 0, tl.maximum(length - window, 0), 0)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    heads = kv_head * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < D)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_DV], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for start in range(lo, length, BLOCK_N):
        pos = start + n
        valid = pos < length
        slot = tl.load(slots_ptr + b * stride_sb + pos, mask=valid, other=0)
        k = tl.load(
            k_ptr + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
            mask=valid[:, None] & (d[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_PAD, BLOCK_N]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        v = tl.load(
            v_ptr + slot[:, None] * stride_vs + kv_head * stride_vh + dv[None, :],
            mask=valid[:, None] & (dv[None, :] < DV),
            other=0.0,
        ).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        total = total * alpha + tl.sum(p, axis=1)
        m = m_new
    total = tl.where(total > 0, total, 1.0)  # an empty context (never in the engine) gives zeros
    out = acc / total[:, None]
    o_mask = (g[:, None] < GROUP) & (dv[None, :] < DV)
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :], out, mask=o_mask)


def decode_attention(
    q: torch.Tensor,  # [B, H, D]
    k_pool: torch.Tensor,  # [S, Hkv, D]
    v_pool: torch.Tensor,  # [S, Hkv, Dv]
    slots: torch.Tensor,  # [B, Lmax] int64, padded with any slot
    lens: torch.Tensor,  # [B] int64
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Softmax attention of one query per request over the first `lens[b]` slots of its row (the last
    `window` of them with a sliding window), read from the pool in place; float32 out [B, H, Dv]."""
    batch, heads, d = q.shape
    kv_heads, dv = v_pool.shape[1], v_pool.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("slots", slots), ("lens", lens)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit stride in its last dimension, got {t.stride()}")
    group = heads // kv_heads
    group_pad, block_d = max(triton.next_power_of_2(group), 2), triton.next_power_of_2(d)
    block_n = min(max(triton.next_power_of_2(SCORE_TILE // (group_pad * block_d)), 8), 64)
    out = torch.empty(batch, heads, dv, dtype=torch.float32, device=q.device)
    if batch == 0:
        return out
    _decode_attention_kernel[(batch, kv_heads)](
        q,
        k_pool,
        v_pool,
        slots,
        lens,
        out,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        slots.stride(0),
        out.stride(0),
        out.stride(1),
        float(scale),
        int(window or 0),
        GROUP=group,
        GROUP_PAD=group_pad,
        D=d,
        DV=dv,
        BLOCK_D=block_d,
        BLOCK_DV=triton.next_power_of_2(dv),
        BLOCK_N=block_n,
    )
    return out


@triton.jit
def _round(x, dtype: tl.constexpr):
    """float32 x rounded to nearest-even in `dtype`; bf16 rounded by its bits (a GPU's cast does the same;
    Triton's interpreter would truncate)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, dim, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr
):
    """One row per program: with a residual, x += residual in place (rounded to x's dtype), then
    x * rsqrt(mean(x^2) + eps) rounded to x's dtype, times the weight, rounded again (Transformers' order)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * dim + cols, mask=mask, other=0.0)
        x = _round(x.to(tl.float32) + r.to(tl.float32), x.dtype)
        tl.store(x_ptr + row * dim + cols, x, mask=mask)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / dim + eps)
    normed = _round(h * rstd, x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * dim + cols, _round(normed * w, x.dtype), mask=mask)


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """silu(gate) rounded to the dtype, times up, rounded (torch's two ops)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    g = tl.load(gate_ptr + i, mask=mask, other=0.0)
    u = tl.load(up_ptr + i, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    silu = _round(gf / (1.0 + tl.exp(-gf)), g.dtype).to(tl.float32)
    tl.store(out_ptr + i, _round(silu * u, g.dtype), mask=mask)


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr, heads, dim, half, BLOCK: tl.constexpr, ROUND: tl.constexpr
):
    """One (token, head) row per program, rotate-half form: out = x * cos + rotate_half(x) * sin, with
    torch's roundings of each product and the sum when ROUND (fp16/bf16)."""
    row = tl.program_id(0).to(tl.int64)
    token = row // heads
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    partner = tl.where(cols < half, cols + half, cols - half)
    xp = tl.load(x_ptr + row * dim + partner, mask=mask, other=0.0).to(tl.float32)
    rotated = tl.where(cols < half, -xp, xp)
    c = tl.load(cos_ptr + token * dim + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + token * dim + cols, mask=mask, other=0.0).to(tl.float32)
    a = x.to(tl.float32) * c
    b = rotated * s
    if ROUND:
        a = _round(a, x.dtype).to(tl.float32)
        b = _round(b, x.dtype).to(tl.float32)
    tl.store(out_ptr + row * dim + cols, _round(a + b, x.dtype), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., dim] contiguous; with `residual` (x's shape, contiguous), x += residual first, in place."""
    dim = x.shape[-1]
    out = torch.empty_like(x)
    rows = x.numel() // dim if dim else 0
    if rows:
        res = residual if residual is not None else x
        _rms_norm_kernel[(rows,)](
            x, res, weight, out, dim, float(eps), residual is not None, triton.next_power_of_2(dim)
        )
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    out = torch.empty_like(gate)
    n = gate.numel()
    if n:
        _silu_mul_kernel[(triton.cdiv(n, block),)](gate, up, out, n, block)
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, dim] contiguous; cos, sin [tokens, dim] contiguous."""
    tokens, heads, dim = x.shape
    out = torch.empty_like(x)
    if x.numel():
        _rope_kernel[(tokens * heads,)](
            x, cos, sin, out, heads, dim, dim // 2, triton.next_power_of_2(dim), x.dtype != torch.float32
        )
    return out


class TritonKernels(TorchKernels):
    """The Triton kernels where the tensors fit them (fp16/bf16/fp32, contiguous, matching dtypes), torch's
    ops otherwise."""

    name = "triton"

    def rms_norm(
        self, x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        fits = x.dtype in DTYPES and norm.weight.dtype == x.dtype and x.is_contiguous()
        if residual is not None:
            fits = (
                fits and residual.dtype == x.dtype and residual.shape == x.shape and residual.is_contiguous()
            )
        if not fits:
            return super().rms_norm(x, norm, residual)
        return rms_norm(x, norm.weight, norm.variance_epsilon, residual)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        fits = x.dtype in DTYPES and cos.dtype == sin.dtype == x.dtype and x.shape[-1] % 2 == 0
        if not (fits and x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()):
            return super().rope(x, cos, sin)
        return rope(x, cos, sin)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.dtype not in DTYPES or up.dtype != gate.dtype or up.shape != gate.shape:
            return super().silu_mul(gate, up)
        return silu_mul(gate.contiguous(), up.contiguous())

    def decode_attention_for(self, dtype: torch.dtype):
        return decode_attention if dtype in DTYPES else None

    def describe(self) -> str:
        return f"{self.name} (triton {triton.__version__})"
