"""What one engine forward hands its attention: where each new token's K/V goes, what each request attends to,
and the backend that computes it (chosen once at load). `LayoutProbe` stands in for a batch during the load's
probe forward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from vriksha.engine.core.kv_layout import LayerKV
from vriksha.engine.core.kv_pool import KVPool

if TYPE_CHECKING:
    from vriksha.engine.attention.backend import AttentionBackend


@dataclass(slots=True)
class PrefillSegment:
    q_start: int  # offset of this request's new tokens in the flattened batch
    q_len: int
    prefix_len: int  # tokens already in the KV pool before this chunk
    kv_slots: torch.Tensor  # [prefix_len + q_len] slots of every token the chunk attends to


@dataclass(slots=True)
class AttentionBatch:
    pool: KVPool
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    num_decode: int  # the first num_decode tokens are decode tokens, one per request
    backend: AttentionBackend  # how the layers attend over the pool (kernel set and pool dtype)
    decode_kv_slots: torch.Tensor | None = None  # [B, Lmax], padded with slot 0
    decode_kv_lens: torch.Tensor | None = None  # [B]
    prefills: list[PrefillSegment] = field(default_factory=list)
    _masks: dict = field(default_factory=dict)

    def decode_mask(self, window: int | None) -> torch.Tensor:
        """[B, 1, 1, Lmax] bool: which padded key positions each decode query attends to."""
        key = ("decode", window)
        if key not in self._masks:
            lens = self.decode_kv_lens
            pos = torch.arange(self.decode_kv_slots.shape[1], device=lens.device)
            mask = pos[None, :] < lens[:, None]
            if window is not None:
                mask &= pos[None, :] > (lens[:, None] - 1 - window)
            self._masks[key] = mask[:, None, None, :]
        return self._masks[key]

    def prefill_mask(self, index: int, window: int | None) -> torch.Tensor | None:
        """[q_len, prefix_len + q_len] bool causal mask with an offset, or None when plain causal applies."""
        seg = self.prefills[index]
        if seg.prefix_len == 0 and window is None:
            return None
        key = ("prefill", index, window)
        if key not in self._masks:
            device = seg.kv_slots.device
            q_pos = torch.arange(seg.q_len, device=device)[:, None] + seg.prefix_len
            k_pos = torch.arange(seg.prefix_len + seg.q_len, device=device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= k_pos > q_pos - window
            self._masks[key] = mask
        return self._masks[key]


class LayoutProbe:
    """Stands in for an engine batch during the probe forward: records K/V shapes by layer index."""

    def __init__(self) -> None:
        self.seen: dict[int, LayerKV] = {}

    def record(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        self.seen[layer] = LayerKV(kv_heads=key.shape[1], k_dim=key.shape[-1], v_dim=value.shape[-1])
