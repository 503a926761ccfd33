"""KV cache events: the radix tree's changes as a stream (ZMQ PUB, msgspec), plus snapshots to resync from.

A leaf package: the server wires a publisher to the engine's radix cache, the router subscribes; neither side
imports the other. See docs/router.md for the schema.
"""

from vriksha.kv_events.schema import (
    AllCleared,
    CacheSnapshot,
    EventBatch,
    PrefixMoved,
    PrefixRemoved,
    PrefixStored,
    decode_batch,
    encode_batch,
)

__all__ = [
    "AllCleared",
    "CacheSnapshot",
    "EventBatch",
    "PrefixRemoved",
    "PrefixMoved",
    "PrefixStored",
    "decode_batch",
    "encode_batch",
]
