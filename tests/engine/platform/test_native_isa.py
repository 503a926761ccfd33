"""Every instruction-set variant of the native kernels compiles here, and each one this CPU runs equals torch
(float32 and bfloat16); a variant needing flags the CPU lacks is skipped with the flags' names."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

from vriksha.engine.platform import native
from vriksha.engine.platform.kernel_sets import TorchKernels
from vriksha.engine.platform.native import isa

VARIANTS = [v.name for v in isa.VARIANTS]
BF16 = torch.bfloat16


def _compiler_takes(flags: tuple[str, ...]) -> bool:
    compiler = native._compiler()
    if compiler is None:
        return False
    done = subprocess.run(
        [compiler, *flags, "-x", "c", "-c", "-o", "/dev/null", "-"],
        input="int x;",
        capture_output=True,
        text=True,
    )
    return done.returncode == 0


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request):
    chosen = isa.variant(request.param)
    if chosen.cflags and not isa.is_x86():
        pytest.skip(f"{chosen.name} is an x86 variant")
    if not _compiler_takes(chosen.cflags):
        pytest.skip(f"the C compiler lacks {' '.join(chosen.cflags)}")
    return chosen


@pytest.fixture(scope="module")
def lib(variant):
    path = native.build(native._compiler(), variant)  # compiles on any x86 machine, runnable or not
    assert path.exists() and path.stat().st_size > 0
    if not isa.runnable(variant):
        pytest.skip(f"needs {', '.join(isa.missing_flags(variant))}")
    return native.Kernels(path, variant)


def test_each_variant_compiles(variant):
    path = native.build(native._compiler(), variant)
    assert path.name.startswith(f"kernels-{variant.name}-") and path.stat().st_size > 0


def test_best_variant_is_runnable_and_widest(monkeypatch):
    forced = os.environ.get("VRIKSHA_NATIVE_ISA")
    if forced:  # the suite runs with a narrower variant forced: that one is chosen
        assert isa.best_variant().name == forced
        monkeypatch.delenv("VRIKSHA_NATIVE_ISA")
    best = isa.best_variant()
    assert isa.runnable(best)
    assert all(not isa.runnable(v) for v in isa.VARIANTS[: isa.VARIANTS.index(best)])


def _near_bf16(got: torch.Tensor, want: torch.Tensor, exact_share: float) -> None:
    """Within one bf16 step everywhere, and bit-equal on at least `exact_share` of the values."""
    assert got.dtype == want.dtype == BF16
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
    assert (got == want).float().mean().item() >= exact_share


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_linear(lib, dtype):
    gen = torch.Generator().manual_seed(1)
    for out_f, in_f in ((64, 96), (7, 5), (33, 40)):
        w, b = torch.randn(out_f, in_f, generator=gen).to(dtype), torch.randn(out_f, generator=gen).to(dtype)
        for rows in (1, 2, 3):
            x = torch.randn(rows, in_f, generator=gen).to(dtype)
            got = lib.linear(x, w, b)
            if dtype == torch.float32:
                torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)
            else:  # float32 sums of the bf16 values, rounded once
                _near_bf16(got, F.linear(x.float(), w.float(), b.float()).to(BF16), 0.9)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_elementwise(lib, dtype):
    gen = torch.Generator().manual_seed(2)
    ref = TorchKernels()
    norm = torch.nn.Module()
    norm.weight = torch.randn(72, generator=gen).to(dtype)
    norm.variance_epsilon = 1e-6
    x, res = (torch.randn(5, 72, generator=gen).to(dtype) for _ in range(2))
    got_x, want_x = x.clone(), x.clone()
    got = lib.rms_norm(got_x, norm.weight, norm.variance_epsilon, residual=res)
    want = ref.rms_norm(want_x, norm, residual=res)
    angles = torch.randn(4, 8, generator=gen).repeat(1, 2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q = torch.randn(4, 3, 16, generator=gen).to(dtype)
    gate, up = torch.randn(3, 700, generator=gen).to(dtype), torch.randn(3, 700, generator=gen).to(dtype)
    pairs = [
        (got_x, want_x),
        (got, want),
        (lib.rope_(q.clone(), cos, sin), ref.rope(q, cos, sin)),
        (lib.silu_mul(gate, up), ref.silu_mul(gate, up)),
    ]
    for a, b in pairs:
        if dtype == torch.float32:
            torch.testing.assert_close(a, b)
        else:
            _near_bf16(a, b, 0.97)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 2, 64), (3, 3, 24)])
def test_decode_attention_over_the_pool(lib, dtype, heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads + d)
    k_pool = torch.randn(200, kv_heads, d, generator=gen).to(dtype)
    v_pool = torch.randn(200, kv_heads, d, generator=gen).to(dtype)
    lens = torch.tensor([1, 9, 70])
    slots = torch.zeros(3, 70, dtype=torch.int64)
    for b, n in enumerate(lens.tolist()):
        slots[b, :n] = torch.randperm(199, generator=gen)[:n] + 1
    q = torch.randn(3, heads, d, generator=gen).to(dtype)
    for window in (None, 4):
        got = lib.decode_attention(q, k_pool, v_pool, slots, lens, d**-0.5, window)
        assert got.dtype == torch.float32
        for b, n in enumerate(lens.tolist()):
            start = max(0, n - window) if window else 0
            keys = k_pool[slots[b, start:n]].float().transpose(0, 1)  # float32 math on the pool's values
            values = v_pool[slots[b, start:n]].float().transpose(0, 1)
            qb = q[b].float().view(kv_heads, heads // kv_heads, d)
            want = F.scaled_dot_product_attention(qb, keys, values, scale=d**-0.5).reshape(heads, d)
            torch.testing.assert_close(got[b], want, rtol=1e-4, atol=1e-4)


def test_greedy_pick(lib):
    """Each variant's greedy pick (the scalar loop in `generic`) is torch's argmax and log-softmax at it."""
    gen = torch.Generator().manual_seed(4)
    for rows, vocab in ((3, 1001), (2, 5)):
        logits = torch.randn(rows, vocab, generator=gen) * 3
        logits[0] = logits[0].clamp(max=1.0)  # several equal maxima: the first is taken
        ids, logprobs = lib.greedy_pick(logits)
        assert ids == logits.argmax(-1).tolist()
        want = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True)).view(-1)
        torch.testing.assert_close(torch.tensor(logprobs), want, rtol=1e-5, atol=1e-5)
