"""GGUF linear weights read raw, by Transformers module: names, tied and untied heads, the rotary row order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vriksha.loading.gguf_weights import read_gguf_linears
from vriksha.loading.packed import dequantize

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
HEADS, KV_HEADS, HIDDEN, FFN = 4, 2, 64, 96


def _interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for a Llama q/k weight."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write(path, arch: str, weights: dict[str, np.ndarray], qtype) -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    for name, w in weights.items():
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            w = _interleave(w, HEADS if "attn_q" in name else KV_HEADS)
        if qtype == Q.F32:
            writer.add_tensor(name, w)
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _weights(untied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
        "attn_v": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (FFN, HIDDEN),
        "ffn_up": (FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
    }
    out = {"token_embd.weight": rng.standard_normal((128, HIDDEN), dtype=np.float32)}
    for layer in range(2):
        for short, shape in shapes.items():
            out[f"blk.{layer}.{short}.weight"] = rng.standard_normal(shape, dtype=np.float32)
    if untied:
        out["output.weight"] = rng.standard_normal((128, HIDDEN), dtype=np.float32)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1])
@pytest.mark.parametrize("untied", [False, True])
def test_blocks_come_back_as_the_transformers_weights(tmp_path, arch, qtype, untied):
    weights = _weights(untied)
    path = tmp_path / "tiny.gguf"
    _write(path, arch, weights, qtype)
    packed = read_gguf_linears(path, tie_word_embeddings=not untied)
    assert len(packed) == 2 * 7 + 1
    head = "output.weight" if untied else "token_embd.weight"
    expect = {"lm_head": head, "model.layers.1.self_attn.q_proj": "blk.1.attn_q.weight"}
    expect |= {
        "model.layers.0.self_attn.k_proj": "blk.0.attn_k.weight",
        "model.layers.1.mlp.down_proj": "blk.1.ffn_down.weight",
    }
    for module, name in expect.items():
        w = weights[name]
        want = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)  # blocks are per row: order-free
        got = dequantize(packed[module])
        assert packed[module].qtype == qtype.name.lower()
        assert torch.equal(got, torch.from_numpy(want.reshape(w.shape))), module


def test_unpackable_types_are_left_out(tmp_path):
    path = tmp_path / "f32.gguf"
    _write(path, "llama", _weights(False), Q.F32)
    assert read_gguf_linears(path) == {}
