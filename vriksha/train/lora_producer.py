"""The off-policy producer with LoRA: its weight versions are adapters, not models.

The producer (`offpolicy.py`) stages each published version and loads it into its own tensors between batches.
With LoRA those tensors are the A and B of its own copy of the adapter (`ProducerAdapter.params`), a few MB per
version instead of the model; `AdapterEngine` then makes the engine take the adapter just loaded before it plays
under the new version: merged into the producer's module for a colocated engine, pushed alone for servers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vriksha.envs.rollout_engine import PassThroughEngine
from vriksha.lora import LoraAdapter, LoraWeights
from vriksha.lora.merge import MergedWeights
from vriksha.train.lora import AdapterSync, adapter_tensors, linear_weight
from vriksha.train.rollout_engine import TrainingEngine

__all__ = ["AdapterEngine", "ProducerAdapter", "producer_engine"]


class ProducerAdapter:
    """The producer's adapter: its own A and B (`params`, what a staged version is copied into), merged into the
    producer's module when `merge` (a colocated engine reads that module)."""

    def __init__(self, module: nn.Module, template: LoraAdapter, merge: bool) -> None:
        own = {
            n: LoraWeights(w.a.detach().clone(), w.b.detach().clone()) for n, w in template.modules.items()
        }
        self.adapter = LoraAdapter(
            template.name,
            template.rank,
            template.alpha,
            template.target_modules,
            own,
            use_rslora=template.use_rslora,
            dropout=template.dropout,
            base_model=template.base_model,
        )
        self.params: list[torch.Tensor] = adapter_tensors(self.adapter)
        self.merged = (
            MergedWeights({n: linear_weight(module.get_submodule(n)).data for n in own}) if merge else None
        )

    def apply(self) -> None:
        """The module takes the adapter's current tensors (the one merged before taken out exactly)."""
        if self.merged is not None:
            self.merged.unmerge()
            self.merged.merge(self.adapter)


class AdapterEngine(PassThroughEngine):
    """A `TrainingEngine` that brings the producer's adapter into its engine before each new version."""

    def __init__(self, inner: TrainingEngine, producer: ProducerAdapter) -> None:
        super().__init__(inner)
        self.inner: TrainingEngine = inner
        self.producer = producer

    def weights_updated(self) -> None:
        self.producer.apply()
        self.inner.weights_updated()

    def set_weight_version(self, version: int) -> None:
        self.producer.apply()
        self.inner.set_weight_version(version)

    def flush_cache(self) -> bool:
        return self.inner.flush_cache()

    def close(self) -> None:
        self.inner.close()


# build_engine's shape, less the keywords the trainer fills in: (module, the adapter it pushes or None)
EngineOver = Callable[[Any, Callable[[], LoraAdapter | None] | None], TrainingEngine]


def producer_engine(
    weights: object, module: nn.Module, engine_over: EngineOver, *, colocated: bool
) -> tuple[Callable[[nn.Module], TrainingEngine], list[torch.Tensor] | None]:
    """How the off-policy producer builds its engine over `module`, and the tensors a weight version loads into
    (None: the module's parameters; with LoRA, `weights` an `AdapterSync`: its own adapter's A and B)."""
    if not isinstance(weights, AdapterSync):
        return lambda m: engine_over(m, None), None
    producer = ProducerAdapter(module, weights.gather(), merge=colocated)
    return lambda m: AdapterEngine(engine_over(m, lambda: producer.adapter), producer), producer.params
