"""The LoRA adapters an engine holds: names, ids, versions, and which ones requests still use.

Each loaded adapter gets an id that is never reused (1, 2, ...; 0 is the base model): a request carries the id
of the adapter it was admitted with, the prefix cache keys its tree by it, and the linear layers find the
adapter's weights by it. Loading a new version under a name already served gives the new version a new id:
requests added from then on use it, while requests still running on an older version keep theirs until they
finish (the older version stays loaded beside the new one, counting against `max_loras`), when it is dropped.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Protocol

from vriksha.errors import InvalidRequestError
from vriksha.lora import AdapterError, LoraAdapter

logger = logging.getLogger(__name__)

__all__ = ["EngineLoras", "LoadedLora", "LoraRegistry", "UnknownLoraError"]


class UnknownLoraError(InvalidRequestError, LookupError):
    """A request or an unload named an adapter the engine does not hold."""


@dataclass(slots=True)
class LoadedLora:
    name: str
    lora_id: int
    rank: int
    path: str | None = None
    version: int | None = None  # the weight version an adapter-only update gave it


class LoraRegistry:
    """Names -> the current version of each adapter, and older versions kept for the requests using them."""

    def __init__(self, max_loras: int, max_rank: int) -> None:
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.current: dict[str, LoadedLora] = {}
        self.retired: dict[int, LoadedLora] = {}  # older versions, by id, while requests use them
        self._ids = itertools.count(1)  # never reused: a new version is a new id

    def __len__(self) -> int:
        return len(self.current) + len(self.retired)

    def resolve(self, name: str) -> LoadedLora:
        loaded = self.current.get(name)
        if loaded is None:
            known = ", ".join(sorted(self.current)) or "none"
            raise UnknownLoraError(f"the LoRA adapter {name!r} is not loaded (loaded: {known})")
        return loaded

    def check(self, adapter: LoraAdapter, *, replacing: bool) -> None:
        """AdapterError when `adapter` cannot be added now: rank over the maximum, or no room left."""
        if adapter.rank > self.max_rank:
            raise AdapterError(
                f"adapter {adapter.name!r} has rank {adapter.rank}, over --max-lora-rank {self.max_rank}; "
                "restart the server with a larger --max-lora-rank"
            )
        if not replacing and adapter.name in self.current:
            raise AdapterError(
                f"an adapter named {adapter.name!r} is already loaded; unload it first or pick another name"
            )
        if len(self) >= self.max_loras:
            retired = (
                f" ({len(self.retired)} older versions still serve running requests)" if self.retired else ""
            )
            raise AdapterError(
                f"cannot load adapter {adapter.name!r}: {len(self)} adapters are loaded, the most --max-loras "
                f"{self.max_loras} allows{retired}; unload one, or raise --max-loras (keep it >= max_staleness "
                "+ 1 when a trainer swaps versions in)"
            )

    def new_id(self) -> int:
        return next(self._ids)

    def make_current(self, loaded: LoadedLora) -> None:
        """`loaded` serves its name from now on; the version it replaces is retired (see `collect`)."""
        previous = self.current.get(loaded.name)
        if previous is not None:
            self.retired[previous.lora_id] = previous
        self.current[loaded.name] = loaded

    def remove(self, name: str) -> LoadedLora:
        """Stop serving `name` to new requests (UnknownLoraError if it is not loaded); returns what it was."""
        loaded = self.resolve(name)
        del self.current[name]
        self.retired[loaded.lora_id] = loaded
        return loaded

    def collect(self, in_use: set[int]) -> list[LoadedLora]:
        """Drop the retired versions no request in `in_use` (ids) runs with; returns them."""
        gone = [lr for i, lr in self.retired.items() if i not in in_use]
        for lr in gone:
            del self.retired[lr.lora_id]
        return gone

    def name_of(self, lora_id: int) -> str | None:
        for lr in (*self.current.values(), *self.retired.values()):
            if lr.lora_id == lora_id:
                return lr.name
        return None


class LoraWeightsHolder(Protocol):
    """Where the adapters' tensors live for the forward pass (the runner's `platform.lora_linear.LoraLinears`)."""

    def add(self, lora_id: int, adapter: LoraAdapter) -> None: ...

    def remove(self, lora_id: int) -> None: ...


class AdapterCache(Protocol):
    def drop_adapter(self, lora_id: int) -> None: ...

    def name_adapter(self, lora_id: int, name: str) -> None: ...


class EngineLoras:
    """An engine's adapters: the registry, their weights in the runner, their prefix-cache trees."""

    def __init__(self, registry: LoraRegistry, weights: LoraWeightsHolder, cache: AdapterCache) -> None:
        self.registry = registry
        self.weights = weights
        self.cache = cache

    def add(
        self,
        adapter: LoraAdapter,
        in_use: set[int],
        *,
        path: str | None = None,
        version: int | None = None,
        replace: bool = False,
    ) -> LoadedLora:
        """Load `adapter` under its name (AdapterError naming what is wrong: shapes, rank, room). With
        `replace`, a new version of a name already served: new requests use it, running ones keep theirs."""
        self.collect(in_use)
        self.registry.check(adapter, replacing=replace)
        lora_id = self.registry.new_id()
        self.weights.add(lora_id, adapter)  # checks the shapes against the base model's layers
        loaded = LoadedLora(adapter.name, lora_id, adapter.rank, path, version)
        self.registry.make_current(loaded)
        self.cache.name_adapter(lora_id, adapter.name)
        self.collect(in_use)
        logger.info("LoRA adapter %r loaded (rank %d, id %d)", adapter.name, adapter.rank, lora_id)
        return loaded

    def remove(self, name: str, in_use: set[int]) -> LoadedLora:
        loaded = self.registry.remove(name)
        self.collect(in_use)
        logger.info("LoRA adapter %r unloaded", name)
        return loaded

    def collect(self, in_use: set[int]) -> None:
        """Free the weights and cached K/V of retired versions no request runs with any more."""
        if not self.registry.retired:
            return
        for gone in self.registry.collect(in_use):
            self.weights.remove(gone.lora_id)
            self.cache.drop_adapter(gone.lora_id)
