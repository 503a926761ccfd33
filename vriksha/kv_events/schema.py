"""The token-granular event schema, shaped like vLLM's KV events (tagged, array-like msgspec structs).

vLLM names fixed-size blocks by chained hashes; vriksha's radix tree is token-granular, so an event names
the cached token path itself:

- `PrefixStored(token_ids, num_cached)`: the whole path from the root is now cached; its first
  `num_cached` tokens were cached before, the rest are new.
- `PrefixRemoved(token_ids, num_tokens)`: the last `num_tokens` of this path are gone, and with them every
  longer path through them (eviction removes leaves; a flush removes whole subtrees).
- `AllCleared()`: the tree is empty (also the first event after a replica starts).
- `PrefixMoved(token_ids, num_tokens, medium)`: the K/V of the last `num_tokens` of this path moved between the
  pool ("pool") and the engine's second KV tier (e.g. "cpu-int8"); the path stays cached (a hit loads it back
  instead of recomputing it), so a mirror keeps scoring it.

Stored and removed paths of a LoRA adapter's tree (the engine keeps one per adapter) carry its name as
`lora_name` (absent: the base model's); a mirror keys its paths by it (`adapter_key`).

Batches travel as ZMQ multipart `[topic, seq (8 bytes, big-endian signed), payload]`, as vLLM's do; the
payload is `EventBatch(ts, events, instance)` where `instance` changes when the replica restarts.
"""

from __future__ import annotations

import msgspec


class KVEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of every token-granular event."""


class PrefixStored(KVEvent):
    token_ids: list[int]
    num_cached: int
    lora_name: str | None = None


class PrefixRemoved(KVEvent):
    token_ids: list[int]
    num_tokens: int
    lora_name: str | None = None


class AllCleared(KVEvent):
    pass


class PrefixMoved(KVEvent):
    token_ids: list[int]
    num_tokens: int
    medium: str
    lora_name: str | None = None


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[PrefixStored | PrefixRemoved | AllCleared | PrefixMoved]
    instance: str = ""


class CacheSnapshot(msgspec.Struct, omit_defaults=True, gc=False):
    """The whole tree after every batch up to and including `seq` (-1: none yet): its leaves' token paths."""

    instance: str
    seq: int
    paths: list[list[int]]
    adapters: dict[str, list[list[int]]] = {}  # each LoRA adapter's leaf paths, by name


def adapter_key(lora_name: str) -> int:
    """A stable positive 31-bit id of an adapter name: the `lora_id` of its vLLM block events, and (negated:
    never a token id) the first element of its paths in a mirror's token tree."""
    import hashlib

    return int.from_bytes(hashlib.sha256(lora_name.encode()).digest()[:4], "big") & 0x7FFFFFFF or 1


def keyed(token_ids: list[int], lora_name: str | None) -> list[int]:
    """A path as a mirror keys it: the base model's as it is, an adapter's behind its negated key."""
    return token_ids if lora_name is None else [-adapter_key(lora_name), *token_ids]


_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(EventBatch)


def encode_batch(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> EventBatch:
    return _batch_decoder.decode(payload)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(raw: bytes) -> int:
    return int.from_bytes(raw, "big", signed=True)
