"""Grammar masks: llguidance's packed int32 words (bit j of word w allows token 32 w + j) applied to logits,
by the native kernel (each instruction-set variant this CPU runs) and by the numpy unpacking it replaces."""

import pytest
import torch

from vriksha.engine.core.logits_processing import NEG_INF, apply_bitmask_unpacked
from vriksha.engine.core.logits_processing import apply_bitmask as apply_bitmask_with
from vriksha.engine.platform import native
from vriksha.engine.platform.native import isa
from vriksha.engine.platform.native.bitmask import SOURCE, bitmask_kernel


def _reference(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for r, words in zip(rows, bitmask.tolist(), strict=True):
        for token in range(logits.shape[1]):
            w, j = divmod(token, 32)
            if w >= len(words) or not (words[w] >> j) & 1:
                out[r, token] = NEG_INF
    return out


def _masks(rows: int, words: int, gen: torch.Generator) -> torch.Tensor:
    """Random words, with whole words of ones (all allowed), of zeros, and single bits mixed in."""
    m = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen)
    kind = torch.randint(0, 4, (rows, words), generator=gen)
    m[kind == 1] = -1
    m[kind == 2] = 0
    single = torch.randint(0, 31, (rows, words), generator=gen, dtype=torch.int32)
    m = torch.where(kind == 3, torch.ones_like(m) << single, m)
    return m


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """`apply_bitmask` with the kernel the engine takes at load (the widest variant this CPU runs)."""
    apply_bitmask_with(logits, rows, bitmask, kernel=bitmask_kernel())


def _variants() -> list[str]:
    names = [v.name for v in isa.VARIANTS if isa.runnable(v)]
    return [n for n in names if bitmask_kernel(n) is not None]


def test_bitmask_matches_the_bit_layout_on_all_rows_and_on_a_subset():
    gen = torch.Generator().manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(4, vocab, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 4), dtype=torch.int32, generator=gen)
    for apply in (apply_bitmask, apply_bitmask_unpacked):
        for rows in ([0, 1, 2, 3], [1, 3]):
            got = logits.clone()
            apply(got, rows, bitmask[: len(rows)])
            assert torch.equal(got, _reference(logits, rows, bitmask[: len(rows)])), (apply, rows)
            untouched = [r for r in range(4) if r not in rows]
            assert torch.equal(got[untouched], logits[untouched])


def test_tokens_past_the_masks_words_are_blocked():
    for apply in (apply_bitmask, apply_bitmask_unpacked):
        logits = torch.zeros(1, 70)
        apply(logits, [0], torch.full((1, 2), -1, dtype=torch.int32))  # 64 tokens allowed
        assert torch.isfinite(logits[0, :64]).all() and (logits[0, 64:] == NEG_INF).all()


def test_a_c_compiler_builds_the_native_kernel():
    assert _variants(), "no variant of the native bitmask kernel built on this machine"
    assert bitmask_kernel().path in ("scalar", "avx2", "avx512")


@pytest.mark.parametrize("variant", [v.name for v in isa.VARIANTS])
def test_each_variant_compiles_runnable_or_not(variant):
    chosen = isa.variant(variant)
    if chosen.cflags and not isa.is_x86():
        pytest.skip(f"{variant} is an x86 variant")
    path = native.build(native._compiler(), chosen, (SOURCE,), native.HEADERS, "bitmask")
    assert path.name.startswith(f"bitmask-{variant}-") and path.stat().st_size > 0


@pytest.mark.parametrize("vocab", [1, 31, 33, 95, 1000, 49152, 49157])
def test_every_variant_equals_the_numpy_unpacking(vocab):
    gen = torch.Generator().manual_seed(vocab)
    batch = 6
    for name in _variants():
        kernel = bitmask_kernel(name)
        for words in ((vocab + 31) // 32, (vocab + 31) // 32 + 1, max(1, vocab // 32 - 1)):
            bitmask = _masks(4, words, gen)
            logits = torch.randn(batch, vocab, generator=gen)
            for rows in ([0, 1, 2, 3], [5, 0, 3, 2]):
                want = logits.clone()
                apply_bitmask_unpacked(want, rows, bitmask)
                got = logits.clone()
                kernel.apply_(got, rows, bitmask)
                assert torch.equal(got, want), (name, vocab, words, rows)
            got = logits.clone()
            kernel.apply_(got, None, bitmask)  # mask i on row i
            want = logits.clone()
            apply_bitmask_unpacked(want, [0, 1, 2, 3], bitmask)
            assert torch.equal(got, want), (name, vocab, words, "rows None")


def test_the_kernel_writes_strided_rows_and_inference_tensors_in_place():
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        base = torch.randn(8, 130, generator=gen)
    logits = base[::2, :97]  # rows 260 floats apart, each contiguous
    bitmask = _masks(4, 4, gen)
    want = logits.clone()
    apply_bitmask_unpacked(want, [0, 1, 2, 3], bitmask)
    apply_bitmask(logits, [0, 1, 2, 3], bitmask)
    assert torch.equal(base[::2, :97], want)
    assert torch.isfinite(base[1::2]).all() and torch.isfinite(base[::2, 97:]).all()


def test_bad_arguments_are_refused_by_name():
    kernel = bitmask_kernel()
    mask = torch.full((1, 2), -1, dtype=torch.int32)
    with pytest.raises(TypeError, match="float32"):
        kernel.apply_(torch.zeros(1, 64, dtype=torch.float64), None, mask)
    with pytest.raises(TypeError, match="int32"):
        kernel.apply_(torch.zeros(1, 64), None, mask.long())
    with pytest.raises(IndexError, match="outside"):
        kernel.apply_(torch.zeros(1, 64), [1], mask)
    with pytest.raises(ValueError, match="rows for"):
        kernel.apply_(torch.zeros(2, 64), [0, 1], mask)
