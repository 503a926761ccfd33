"""Merging an adapter into weights in place and taking it out again: the base comes back bit for bit, where
subtracting the delta alone would not."""

from __future__ import annotations

import pytest
import torch

from vriksha.lora import AdapterError, LoraAdapter, LoraWeights
from vriksha.lora.merge import LoraMergeError, MergedWeights


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _case(dtype: torch.dtype, seed: int = 0, scale: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    weights = {f"layers.{i}.proj": (torch.randn(48, 80, generator=g) * 0.05).to(dtype) for i in range(3)}
    modules = {
        n: LoraWeights(torch.randn(8, 80, generator=g) * scale, torch.randn(48, 8, generator=g) * scale)
        for n in weights
    }
    return weights, LoraAdapter("a", 8, 16.0, ("proj",), modules)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unmerge_restores_the_base_bit_for_bit_where_subtracting_does_not(dtype):
    weights, adapter = _case(dtype)
    base = {n: w.clone() for n, w in weights.items()}
    merged = MergedWeights(weights)
    merged.merge(adapter)
    for n, w in weights.items():
        want = (base[n].float() + adapter.delta(n)).to(dtype)
        assert torch.equal(_bits(w), _bits(want))  # the merge is base + scaling * B A, rounded once
    naive = {n: (w.float() - adapter.delta(n)).to(dtype) for n, w in weights.items()}
    assert any(not torch.equal(_bits(naive[n]), _bits(base[n])) for n in weights)  # subtracting drifts
    assert merged.fixed_positions > 0
    assert merged.unmerge() is True
    for n, w in weights.items():
        assert torch.equal(_bits(w), _bits(base[n]))
    assert merged.unmerge() is False  # nothing merged any more


def test_many_rounds_never_drift():
    weights, adapter = _case(torch.float32, seed=1, scale=0.2)
    base = {n: w.clone() for n, w in weights.items()}
    merged = MergedWeights(weights)
    for step in range(5):
        for w in adapter.modules.values():
            w.b.add_(0.01 * (step + 1))  # the adapter trains between merges; the merge keeps its own copy
        merged.merge(adapter)
        merged.unmerge()
    assert all(torch.equal(_bits(weights[n]), _bits(base[n])) for n in weights)


def test_merge_twice_and_a_weight_written_while_merged_are_refused():
    weights, adapter = _case(torch.float32)
    merged = MergedWeights(weights)
    merged.merge(adapter)
    with pytest.raises(LoraMergeError, match="still merged"):
        merged.merge(adapter)
    next(iter(weights.values()))[0, 0] += 1.0
    with pytest.raises(LoraMergeError, match="did not restore"):
        merged.unmerge()


def test_a_misshapen_adapter_touches_nothing():
    weights, adapter = _case(torch.float32)
    base = {n: w.clone() for n, w in weights.items()}
    adapter.modules["layers.9.proj"] = adapter.modules["layers.0.proj"]
    with pytest.raises(AdapterError, match="layers.9.proj"):
        MergedWeights(weights).merge(adapter)
    assert all(torch.equal(weights[n], base[n]) for n in weights)


def test_weights_larger_than_one_block_merge_and_restore(monkeypatch):
    import vriksha.lora.merge as merge_mod

    monkeypatch.setattr(
        merge_mod, "_BLOCK_BYTES", 7 * 80 * 4
    )  # blocks of 7 rows: 48 rows end in a partial one
    weights, adapter = _case(torch.float32, seed=2, scale=0.2)
    base = {n: w.clone() for n, w in weights.items()}
    merged = MergedWeights(weights)
    merged.merge(adapter)
    assert merged.fixed_positions > 0
    for n, w in weights.items():
        assert torch.allclose(w, base[n] + adapter.delta(n), rtol=0, atol=1e-6)
    merged.unmerge()
    assert all(torch.equal(_bits(weights[n]), _bits(base[n])) for n in weights)
