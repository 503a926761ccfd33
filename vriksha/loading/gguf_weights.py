"""The packed blocks of a GGUF file's linear weights, by the Transformers module they belong to.

The tensors are read from the file's tensor table (`gguf_index`, no dequantisation) and named as the Transformers model
converted from the same file names its modules (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj`).
llama.cpp's converter stores a Llama model's query and key rows in an interleaved rotary order; those rows are
put back in Transformers' order, so each packed weight dequantizes to exactly the converted module's weight.
A tied `lm_head` is served from the token embedding's blocks. Tensors of other types (F32, F16, Q2_K, Q3_K, the
IQ formats) are not returned: their modules keep the fp32 path.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from vriksha.loading.gguf_index import GGUFIndex, GGUFTensor, read_gguf_index
from vriksha.loading.packed import PackedWeight, permute_rows

logger = logging.getLogger(__name__)

_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_PACKABLE = {t: t.lower() for t in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")}
_ROTARY_PERMUTED = {"llama"}  # architectures whose q/k rows llama.cpp's converter interleaves
_BLK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def _hf_module(name: str) -> str | None:
    if name == "output.weight":
        return "lm_head"
    m = _BLK.fullmatch(name)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{_LAYER_TENSORS[m.group(2)]}"
    return None


def _rotary_order(rows: int, heads: int) -> torch.Tensor:
    """Transformers' row order from llama.cpp's: Transformers row j is GGUF row order[j]."""
    interleaved = torch.arange(rows).reshape(heads, 2, rows // heads // 2).transpose(1, 2).reshape(-1)
    return torch.argsort(interleaved)


def _linear_tensors(index: GGUFIndex, tie_word_embeddings: bool) -> Iterator[tuple[str, GGUFTensor]]:
    """(Transformers module name, tensor) for every linear layer's weight in the file."""
    names = {t.name for t in index.tensors}
    for tensor in index.tensors:
        module = _hf_module(tensor.name)
        if module is None and tensor.name == "token_embd.weight" and tie_word_embeddings:
            module = None if "output.weight" in names else "lm_head"
        if module is not None:
            yield module, tensor


def gguf_linear_types(path: Path, tie_word_embeddings: bool = True) -> list[tuple[str | None, int, int]]:
    """(packed type or None where no packed kernel serves it, out, in) of every linear layer in the file, read
    from its index alone (no weight is read)."""
    out = []
    for _, tensor in _linear_tensors(read_gguf_index(path), tie_word_embeddings):
        in_features, out_features = (int(n) for n in tensor.shape)
        out.append((_PACKABLE.get(tensor.type_name), out_features, in_features))
    return out


def read_gguf_linears(path: Path, tie_word_embeddings: bool = True) -> dict[str, PackedWeight]:
    """{Transformers module name: packed weight} for every linear layer stored in a packable type."""
    index = read_gguf_index(path)
    arch = index.metadata.get("general.architecture") or "llama"
    heads = index.metadata.get(f"{arch}.attention.head_count")
    kv_heads = index.metadata.get(f"{arch}.attention.head_count_kv") or heads
    packed: dict[str, PackedWeight] = {}
    skipped: Counter[str] = Counter()
    for module, tensor in _linear_tensors(index, tie_word_embeddings):
        qtype = _PACKABLE.get(tensor.type_name)
        if qtype is None:
            skipped[tensor.type_name] += 1
            continue
        in_features, out_features = (int(n) for n in tensor.shape)  # GGUF lists dimensions innermost first
        data = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True)).reshape(out_features, -1)
        weight = PackedWeight(qtype, data, out_features, in_features)
        if arch in _ROTARY_PERMUTED and module.endswith(("q_proj", "k_proj")):
            weight = permute_rows(
                weight, _rotary_order(out_features, heads if "q_proj" in module else kv_heads)
            )
        packed[module] = weight
    if skipped:
        logger.info("%s: linear weights of types %s stay fp32 (no packed kernel)", path.name, dict(skipped))
    return packed
