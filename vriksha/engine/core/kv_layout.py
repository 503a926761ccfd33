"""What the KV pool must hold for a model, read off the model itself rather than its config (the probe
forward that reads it: `attention/layout_probe.py`).

A config names heads and head sizes in a dozen ways (`head_dim`, `kv_lora_rank` + rope dims, `rotary_pct`,
per-layer lists), and some families attend over K/V of another shape than their hidden size suggests (multi-head
latent attention expands its latent into full heads whose key and value sizes differ). So the engine runs one
two-token forward with its attention in probe mode and records, per layer, the K and V shapes the model hands to
attention: the pool is laid out from what the model really does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class LayerKV:
    kv_heads: int
    k_dim: int
    v_dim: int


@dataclass(frozen=True, slots=True)
class KVLayout:
    layers: tuple[LayerKV, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum(layer.kv_heads * (layer.k_dim + layer.v_dim) for layer in self.layers) * size
