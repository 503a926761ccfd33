"""The engine's attention, registered with Transformers' AttentionInterface.

The model runs one flattened ragged batch ([1, T] tokens, no padding computed). For each layer this function
writes the new tokens' K/V into the pool, then hands the layer's queries to the batch's attention backend
(`backend.py`, chosen once at load for the kernel set and the pool's dtype), or to `ExplicitSoftmaxAttention`
for a layer with terms SDPA cannot express. The batch layout is published by the model runner through
`forward_context` before the forward pass; outside one (training, a plain Transformers call) the function
computes the family's own attention.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator

import torch

from vriksha.engine.attention.backend import LayerCall
from vriksha.engine.attention.batch import AttentionBatch, LayoutProbe
from vriksha.engine.attention.explicit_softmax import ExplicitSoftmaxAttention

ATTENTION_NAME = "vriksha_paged"


class _Context(threading.local):
    """The batch of the engine forward running in this thread: per thread, so that an engine's forward
    and a plain forward (training, another engine) in other threads of the process never see it."""

    batch: AttentionBatch | LayoutProbe | None = None


_context = _Context()


@contextlib.contextmanager
def forward_context(batch: AttentionBatch | LayoutProbe) -> Iterator[None]:
    previous, _context.batch = _context.batch, batch
    try:
        yield
    finally:
        _context.batch = previous


def _layer_window(module: torch.nn.Module, kwargs: dict) -> int | None:
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    return int(window) if window else None


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, T, D] (RoPE applied)
    key: torch.Tensor,  # [1, Hkv, T, D]
    value: torch.Tensor,  # [1, Hkv, T, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    batch = _context.batch
    if batch is None or isinstance(batch, LayoutProbe):
        # a forward outside the engine (training, a plain HF call) behaves exactly like the family's own attention
        if isinstance(batch, LayoutProbe):
            batch.record(module.layer_idx, key, value)
        return _reference_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    layer, pool = module.layer_idx, batch.pool
    pool.write(layer, batch.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    window = _layer_window(module, kwargs)
    call = LayerCall(layer, query, key, value, scaling, window, pool.k[layer], pool.v[layer])
    backend = ExplicitSoftmaxAttention.of(module, kwargs) or batch.backend
    out = query.new_empty(query.shape[2], call.num_heads, value.shape[-1])
    backend.attend(call, batch, out)
    return out.unsqueeze(0), None


def _reference_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    """The attention the family itself would run: SDPA, or its eager code where it has terms SDPA lacks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if ExplicitSoftmaxAttention.of(module, kwargs) is not None:
        forward = getattr(inspect.getmodule(type(module)), "eager_attention_forward", None)
        if forward is not None:
            return forward(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )


def _mask(*args, **kwargs):
    if _context.batch is not None:
        return None  # the engine builds its own masks from the batch layout
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register_attention() -> str:
    """Register the engine's attention and mask builder with Transformers; returns the name to select them.

    Outside an engine forward pass both behave exactly like Transformers' SDPA path, so a model the engine
    wraps in place still trains normally.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _mask)
    return ATTENTION_NAME
