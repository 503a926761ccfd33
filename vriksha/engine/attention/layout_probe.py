"""The load's probe forward: one two-token forward with the engine's attention in probe mode records, per
layer, the K and V shapes the model hands to attention, and the KV pool is laid out from them
(`core/kv_layout.py` says why the config is not read instead)."""

from __future__ import annotations

import torch

from vriksha.engine.attention.batch import LayoutProbe
from vriksha.engine.attention.paged import forward_context, register_attention
from vriksha.engine.core.kv_layout import KVLayout
from vriksha.errors import ModelLoadError


def probe_kv_layout(model: torch.nn.Module) -> KVLayout:
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
