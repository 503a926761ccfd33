"""What the KV pool must hold for a model, read off the model itself rather than its config.

A config names heads and head sizes in a dozen ways (`head_dim`, `kv_lora_rank` + rope dims, `rotary_pct`,
per-layer lists), and some families attend over K/V of another shape than their hidden size suggests (multi-head
latent attention expands its latent into full heads whose key and value sizes differ). So the engine runs one
two-token forward with its attention in probe mode and records, per layer, the K and V shapes the model hands to
attention: the pool is laid out from what the model really does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vriksha.errors import ModelLoadError


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


class LayoutProbe:
    """Stands in for an engine batch during the probe forward: records K/V shapes by layer index."""

    def __init__(self) -> None:
        self.seen: dict[int, LayerKV] = {}

    def record(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        self.seen[layer] = LayerKV(kv_heads=key.shape[1], k_dim=key.shape[-1], v_dim=value.shape[-1])


def probe_kv_layout(model: torch.nn.Module) -> KVLayout:
    from vriksha.engine.attention.paged import forward_context, register_attention

    config = model.config
    original = getattr(config, "_attn_implementation", None)
    probe = LayoutProbe()
    model.set_attn_implementation(register_attention())
    device = next(model.parameters()).device
    try:
        with torch.inference_mode(), forward_context(probe):
            model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device), use_cache=False)
    except Exception as exc:
        raise ModelLoadError(
            f"the engine could not run {type(model).__name__} through its attention: {exc}"
        ) from exc
    finally:
        if original is not None:
            model.set_attn_implementation(original)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_layers = int(text.num_hidden_layers)
    missing = [i for i in range(num_layers) if i not in probe.seen]
    if not probe.seen:
        raise ModelLoadError(
            f"{type(model).__name__} computes attention in its own code instead of through Transformers' "
            "AttentionInterface, so the engine cannot give it a KV cache (families written this way, such as "
            "Bloom, MPT, and Falcon before Transformers 5.25, need their attention moved onto the interface in "
            "Transformers first); "
            "run it with Transformers' generate() instead"
        )
    if max(probe.seen) >= num_layers:
        raise ModelLoadError(
            f"{type(model).__name__}: attention layers do not match num_hidden_layers={num_layers}"
        )
    if missing:
        raise ModelLoadError(
            f"{type(model).__name__}: layers {missing} never call attention (shared or recurrent layers); the "
            "engine's KV pool needs every layer to attend over its own K/V"
        )
    return KVLayout(tuple(probe.seen[i] for i in range(num_layers)))
