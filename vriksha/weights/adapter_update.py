"""Adapter-only weight updates, the engine's side: what an update of a LoRA adapter names, the tensors it must
send, and where a complete one goes.

A trainer with LoRA sends only the adapter after each update: `/start_weight_update` carries `adapter` (its
name, rank, alpha, rsLoRA flag, target modules and the exact base modules it adapts), and the tensors travel
over the same data planes as full weights, named by PEFT's keys (`base_model.model.<module>.lora_A.weight`,
float32). The update is staged and checked as a full one is (every tensor named, shaped [rank, in] and
[out, rank] against the base model's linear layers, nothing applied until `finish`), then handed to an
`AdapterSink`.

The sink here, `MergedAdapterSink`, is the minimal one: the engine serves base + the newest adapter, merged
into its weights in place (the adapter before it taken out bit for bit first, `vriksha/lora/merge.py`), under
the update's version. A multi-LoRA engine replaces it with one that registers the adapter by name instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vriksha.lora import AdapterError, LoraAdapter, peft_key
from vriksha.lora.merge import LoraMergeError, MergedWeights
from vriksha.weights.plan import WeightTransferError, digest

logger = logging.getLogger(__name__)

__all__ = ["AdapterMeta", "AdapterSink", "MergedAdapterSink", "adapter_targets", "build_adapter"]

MAX_RANK = 4096


@dataclass(frozen=True, slots=True)
class AdapterMeta:
    """What `/start_weight_update`'s `adapter` says of the adapter the update carries."""

    name: str
    rank: int
    alpha: float
    modules: tuple[str, ...]  # the base model's modules it adapts
    target_modules: tuple[str, ...] = ()
    use_rslora: bool = False

    @classmethod
    def of(cls, adapter: LoraAdapter) -> AdapterMeta:
        return cls(
            adapter.name,
            adapter.rank,
            adapter.alpha,
            tuple(adapter.modules),
            tuple(adapter.target_modules),
            adapter.use_rslora,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rank": self.rank,
            "alpha": self.alpha,
            "modules": list(self.modules),
            "target_modules": list(self.target_modules),
            "use_rslora": self.use_rslora,
        }

    @classmethod
    def from_json(cls, raw: object) -> AdapterMeta:
        if not isinstance(raw, dict):
            raise WeightTransferError("adapter must be an object {name, rank, alpha, modules, ...}")
        name, rank, alpha, modules = (raw.get(k) for k in ("name", "rank", "alpha", "modules"))
        if not isinstance(name, str) or not name:
            raise WeightTransferError("adapter.name must be a non-empty string")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
            raise WeightTransferError(f"adapter.rank must be an integer in 1..{MAX_RANK}, got {rank!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < float("inf"):
            raise WeightTransferError(f"adapter.alpha must be a positive number, got {alpha!r}")
        if not isinstance(modules, list) or not modules or not all(isinstance(m, str) for m in modules):
            raise WeightTransferError("adapter.modules must list the base model's modules it adapts")
        targets = raw.get("target_modules") or []
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise WeightTransferError("adapter.target_modules must be a list of module names")
        return cls(name, rank, float(alpha), tuple(modules), tuple(targets), bool(raw.get("use_rslora")))


def _linear_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def adapter_targets(model: torch.nn.Module, meta: AdapterMeta) -> dict[str, torch.Tensor]:
    """The tensors an update of `meta` must send, as float32 meta tensors under PEFT's keys, checked against
    the base model: each adapted module must be one of its linear layers."""
    linear = _linear_weights(model)
    out: dict[str, torch.Tensor] = {}
    for module in meta.modules:
        w = linear.get(module)
        if w is None:
            raise WeightTransferError(
                f"adapter {meta.name!r} adapts {module!r}, which is not a linear layer of the served model"
            )
        out_f, in_f = w.shape
        out[peft_key(module, "A")] = torch.empty(meta.rank, in_f, dtype=torch.float32, device="meta")
        out[peft_key(module, "B")] = torch.empty(out_f, meta.rank, dtype=torch.float32, device="meta")
    return out


def build_adapter(meta: AdapterMeta, staged: Mapping[str, torch.Tensor]) -> LoraAdapter:
    """The adapter a complete update staged (every tensor checked again: finite, the rank's shapes)."""
    try:
        return LoraAdapter.from_peft_state_dict(
            staged,
            name=meta.name,
            rank=meta.rank,
            alpha=meta.alpha,
            target_modules=meta.target_modules or None,
            use_rslora=meta.use_rslora,
        )
    except AdapterError as exc:
        raise WeightTransferError(f"the adapter update was refused: {exc}") from None


class AdapterSink(Protocol):
    """Where a complete adapter update goes (in the engine thread, the engine idle)."""

    def apply(self, engine: Any, adapter: LoraAdapter) -> None: ...

    def weights_replaced(self) -> None:
        """A full weight update overwrote every parameter."""
        ...

    def digests(self) -> dict[str, str]:
        """sha256 of each tensor of the adapter in use, by PEFT key (empty when none)."""
        ...


class MergedAdapterSink:
    """The engine serves base + the newest adapter, merged in place (the previous one taken out first)."""

    def __init__(self) -> None:
        self.merged: MergedWeights | None = None

    @property
    def adapter(self) -> LoraAdapter | None:
        return self.merged.adapter if self.merged is not None else None

    def apply(self, engine: Any, adapter: LoraAdapter) -> None:
        if self.merged is None:
            self.merged = MergedWeights({n: w.data for n, w in _linear_weights(engine.model).items()})
        try:
            adapter.check_base(self.merged.shapes())  # before the adapter in use is taken out
            self.merged.unmerge()
            self.merged.merge(adapter)
        except (AdapterError, LoraMergeError) as exc:
            raise WeightTransferError(f"the adapter update could not be applied: {exc}") from None
        logger.info(
            "adapter %r merged (%d modules, rank %d)", adapter.name, len(adapter.modules), adapter.rank
        )

    def weights_replaced(self) -> None:
        if self.merged is not None:
            self.merged.forget()

    def digests(self) -> dict[str, str]:
        adapter = self.adapter
        return {k: digest(t) for k, t in adapter.peft_state_dict().items()} if adapter is not None else {}
