"""Adapter-only updates into a multi-LoRA engine (`--enable-lora`): each complete update registers the adapter
under its name as a new version, beside the versions requests still run on.

Requests added after the update use the new version; requests running on an older one finish on it, and the
older version is dropped when the last of them ends (`engine/core/lora_registry.py`). So a trainer with
`max_staleness` K >= 1 needs the server's `--max-loras` >= K + 1 (versions side by side). Unlike a full update,
nothing waits for running requests, and the base model's prefix cache stays valid (its weights did not change).
"""

from __future__ import annotations

import logging
from typing import Any

from vriksha.lora import AdapterError, LoraAdapter
from vriksha.weights.plan import WeightTransferError, digest

logger = logging.getLogger(__name__)

__all__ = ["ServedAdapterSink"]


class ServedAdapterSink:
    """An `AdapterSink` that registers each update's adapter in the engine's LoRA registry."""

    side_by_side = True  # running requests keep their version: the update need not wait for them

    def __init__(self) -> None:
        self.adapters: dict[str, LoraAdapter] = {}  # the newest version of each name, for digests

    def apply(self, engine: Any, adapter: LoraAdapter) -> None:
        try:
            engine.add_lora(adapter, replace=True)
        except AdapterError as exc:
            raise WeightTransferError(f"the adapter update could not be applied: {exc}") from None
        self.adapters[adapter.name] = adapter
        logger.info("adapter %r: a new version serves new requests (rank %d)", adapter.name, adapter.rank)

    def weights_replaced(self) -> None:
        pass  # adapters are added to whatever the base weights are

    def digests(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for adapter in self.adapters.values():
            out.update({k: digest(t) for k, t in adapter.peft_state_dict().items()})
        return out
