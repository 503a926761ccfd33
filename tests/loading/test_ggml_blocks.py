"""GGML block formats dequantized by torch equal the `gguf` package's reference dequantizer bit for bit: on
weights its quantizers make (the legacy formats) and on random blocks (the K-quants, which it cannot make)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.gguf_files import random_blocks
from vriksha.loading.ggml_blocks import BLOCKS, dequantize_blocks, dequantize_like_gguf

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return (
        got.shape == want.shape
        and got.dtype == want.dtype
        and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    )


def test_every_format_has_the_gguf_block_size():
    for name, (weights, size) in BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[Q[name]] == (weights, size), name


@pytest.mark.parametrize("type_name", LEGACY)
def test_legacy_formats_equal_gguf_on_its_own_quantization(type_name):
    rng = np.random.default_rng(1)
    weights = rng.standard_normal((48, 256), dtype=np.float32)
    weights[3] = 0.0  # an all-zero row: a zero scale
    data = gguf.quants.quantize(weights, Q[type_name])
    want = gguf.quants.dequantize(data, Q[type_name])
    got = dequantize_like_gguf(data, Q[type_name])
    assert _same_bits(got, want)
    assert np.abs(got - weights).max() < 0.5  # and it is the weight, roughly: the layout is read right


@pytest.mark.parametrize("type_name", LEGACY + K_QUANTS)
def test_random_blocks_equal_gguf_bit_for_bit(type_name):
    data = random_blocks(type_name, rows=40, blocks_a_row=3)
    want = gguf.quants.dequantize(data, Q[type_name])
    assert _same_bits(dequantize_like_gguf(data, Q[type_name]), want)
    # and through the torch entry point, on a 3-d tensor of rows
    got = dequantize_blocks(type_name, torch.from_numpy(data.reshape(4, 10, -1)))
    assert torch.equal(got.reshape(want.shape), torch.from_numpy(want))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q4_K", "Q6_K"])
def test_tensors_larger_than_a_chunk(type_name, monkeypatch):
    """A tensor is dequantized in chunks of blocks; chunk edges inside a row change nothing."""
    import vriksha.loading.ggml_blocks as blocks

    monkeypatch.setattr(blocks, "_CHUNK_WEIGHTS", 3 * BLOCKS[type_name][0])  # three blocks a chunk
    data = random_blocks(type_name, rows=7, blocks_a_row=5, seed=2)
    assert _same_bits(dequantize_like_gguf(data, Q[type_name]), gguf.quants.dequantize(data, Q[type_name]))


def test_other_types_go_to_gguf():
    halves = np.arange(64, dtype=np.float16).reshape(2, 32)
    got = dequantize_like_gguf(halves.view(np.uint8), Q.F16)
    assert np.array_equal(got, halves.astype(np.float32))


def test_partial_blocks_are_refused():
    with pytest.raises(ValueError, match="whole 144-byte blocks"):
        dequantize_blocks("Q4_K", torch.zeros(2, 100, dtype=torch.uint8))
