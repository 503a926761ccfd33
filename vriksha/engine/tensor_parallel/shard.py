"""Split a Llama-shaped decoder (Llama, Qwen2, Qwen3) over the ranks of a tensor-parallel group, in place.

Each rank keeps `heads / N` attention heads and `kv_heads / N` KV heads (rows of q/k/v_proj) and
`intermediate / N` MLP columns (rows of gate/up_proj); o_proj and down_proj keep the matching input columns
and sum their partial outputs over the ranks with one all-reduce each (`RowParallel`), so a decoder layer
costs two all-reduces per step. The norms (Qwen3's per-head q/k norms included), the embedding and the LM
head stay whole on every rank: only rank 0 computes logits, for its sampler, and the others run the head on
no rows at all (see docs/engine.md for why the vocabulary is not split).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vriksha.errors import ConfigError

SUPPORTED_LAYERS = frozenset({"LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"})


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_degree(config, size: int) -> None:
    """`size` must divide the attention heads, the KV heads and the MLP width; the message names them."""
    if size < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {size}")
    if size == 1:
        return
    text = _text_config(config)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    width = int(text.intermediate_size)
    bad = [
        f"{name} ({value})"
        for name, value in (("attention heads", heads), ("KV heads", kv_heads), ("MLP width", width))
        if value % size
    ]
    if bad:
        common = [d for d in _divisors(kv_heads) if heads % d == 0 and width % d == 0]
        raise ConfigError(
            f"tensor_parallel_size {size} does not divide the model's {' and '.join(bad)}; "
            f"this model splits over {', '.join(map(str, common))} ranks"
        )


def unsupported_reason(model: nn.Module) -> str | None:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not isinstance(getattr(model, "lm_head", None), nn.Linear):
        return "not a decoder stack of the Llama shape"
    for layer in layers:
        if type(layer).__name__ not in SUPPORTED_LAYERS:
            return f"layer class {type(layer).__name__} (tensor parallel serves {', '.join(sorted(SUPPORTED_LAYERS))})"
    return None


class RowParallel(nn.Module):
    """A linear layer holding a slice of the input features: its partial outputs are summed over the ranks,
    then the bias (kept whole, added once) is added."""

    def __init__(self, linear: nn.Linear, all_reduce: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self.bias = linear.bias
        linear.bias = None
        self.linear = linear
        self._all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self._all_reduce(out)
        return out if self.bias is None else out + self.bias


def _keep_rows(linear: nn.Linear, rank: int, size: int) -> None:
    rows = linear.out_features // size
    keep = slice(rank * rows, (rank + 1) * rows)
    linear.weight = nn.Parameter(linear.weight.data[keep].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[keep].clone(), requires_grad=False)
    linear.out_features = rows


def _keep_columns(linear: nn.Linear, rank: int, size: int) -> None:
    cols = linear.in_features // size
    keep = slice(rank * cols, (rank + 1) * cols)
    linear.weight = nn.Parameter(linear.weight.data[:, keep].clone(), requires_grad=False)
    linear.in_features = cols


def shard_model(
    model: nn.Module, rank: int, size: int, all_reduce: Callable[[torch.Tensor], None]
) -> nn.Module:
    """Keep this rank's heads and MLP columns of every layer; `all_reduce` sums a tensor over the group."""
    check_degree(model.config, size)
    reason = unsupported_reason(model)
    if reason is not None:
        raise ConfigError(
            f"tensor-parallel serving does not support this model: {reason}; serve it on one rank"
        )
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _keep_rows(linear, rank, size)
        _keep_columns(attn.o_proj, rank, size)
        _keep_columns(mlp.down_proj, rank, size)
        attn.o_proj = RowParallel(attn.o_proj, all_reduce)
        mlp.down_proj = RowParallel(mlp.down_proj, all_reduce)
        for name in ("num_heads", "num_key_value_heads"):  # families that keep head counts on the module
            if isinstance(getattr(attn, name, None), int):
                setattr(attn, name, getattr(attn, name) // size)
    return model
