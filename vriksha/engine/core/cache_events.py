"""What the prefix cache tells a listener: token runs stored, removed, everything cleared.

Events name cached token paths, not tree nodes, so that a mirror of the cache elsewhere (a router) can apply
them to its own tree: a node split changes no path and sends nothing. A sink is called synchronously from
the engine's step; one that publishes over the network should hand events to its own queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class CacheEventSink(Protocol):
    def stored(self, parent: Sequence[int], token_ids: Sequence[int], slots: torch.Tensor) -> None:
        """`token_ids` are now cached right after the cached path `parent`, their KV at `slots`."""

    def removed(self, parent: Sequence[int], token_ids: Sequence[int]) -> None:
        """The run `token_ids` after `parent` left the cache: every path `parent + token_ids[:i]` (i >= 1) and
        every longer path through them (the subtree below)."""

    def cleared(self) -> None:
        """Everything left the cache."""


class TierEventSink(CacheEventSink, Protocol):
    """A sink that also hears of tier moves (the radix tree calls `moved` on a sink that has it)."""

    def moved(self, parent: Sequence[int], token_ids: Sequence[int], medium: str) -> None:
        """The K/V of the run `token_ids` after `parent` moved to `medium` ("pool", or the second tier's
        name, e.g. "cpu-int8"); the path stays cached."""


class AdapterEvents:
    """The events of one LoRA adapter's tree, passed on to `sink` tagged with the adapter's name (a sink's
    `stored` and `removed` take `lora_name`). Its tree is emptied only by removals, never by `cleared`."""

    def __init__(self, sink: CacheEventSink, lora_name: str) -> None:
        self.sink = sink
        self.lora_name = lora_name

    def stored(self, parent: Sequence[int], token_ids: Sequence[int], slots: torch.Tensor) -> None:
        self.sink.stored(parent, token_ids, slots, lora_name=self.lora_name)  # type: ignore[call-arg]

    def removed(self, parent: Sequence[int], token_ids: Sequence[int]) -> None:
        self.sink.removed(parent, token_ids, lora_name=self.lora_name)  # type: ignore[call-arg]

    def moved(self, parent: Sequence[int], token_ids: Sequence[int], medium: str) -> None:
        moved = getattr(self.sink, "moved", None)
        if moved is not None:
            moved(parent, token_ids, medium, lora_name=self.lora_name)

    def cleared(self) -> None:
        pass
