"""The same tree changes as vLLM-format block events, for routers that speak vLLM's KV events (vllm-router's
kv_aware policy): fixed-size blocks from the root, named by chained 63-bit hashes of their token ids.

A block is announced when every one of its tokens is cached along one path, and removed when a removal cuts
into it (or into the path above it). Partial trailing blocks are never announced, as in vLLM.
"""

from __future__ import annotations

import hashlib

import msgspec

from vriksha.kv_events.schema import adapter_key


class VLLMEvent(msgspec.Struct, gc=False, tag=True):
    """Tagged maps ({"type": "BlockStored", ...}), as current vLLM and vllm-router exchange them."""


class BlockStored(VLLMEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class BlockRemoved(VLLMEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(VLLMEvent):
    pass


class VLLMEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def block_hash(parent: int | None, tokens: list[int]) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update((parent if parent is not None else -1).to_bytes(8, "little", signed=True))
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return int.from_bytes(h.digest(), "little") >> 1


def chain_hashes(
    token_ids: list[int], block_size: int, upto: int | None = None, root: int | None = None
) -> list[int]:
    """The hashes of the first `upto` complete blocks of `token_ids` (all of them by default); `root`: the
    parent of the first block (a LoRA adapter's key, so that its blocks never hash as the base model's)."""
    n = len(token_ids) // block_size if upto is None else upto
    out: list[int] = []
    parent: int | None = root
    for b in range(n):
        parent = block_hash(parent, token_ids[b * block_size : (b + 1) * block_size])
        out.append(parent)
    return out


def stored_blocks(
    token_ids: list[int], num_cached: int, block_size: int, lora_name: str | None = None
) -> BlockStored | None:
    """The complete blocks that became cached when `token_ids[num_cached:]` were added (to the tree of the
    adapter `lora_name`, None: the base model's)."""
    first = num_cached // block_size  # the block holding the first new token was not complete before
    last = len(token_ids) // block_size  # exclusive
    if last <= first:
        return None
    lora_id = adapter_key(lora_name) if lora_name is not None else None
    hashes = chain_hashes(token_ids, block_size, last, lora_id)
    return BlockStored(
        block_hashes=hashes[first:],
        parent_block_hash=hashes[first - 1] if first > 0 else None,
        token_ids=token_ids[first * block_size : last * block_size],
        block_size=block_size,
        lora_id=lora_id,
        lora_name=lora_name,
    )


def removed_blocks(
    cut_paths: list[list[int]], start: int, block_size: int, lora_name: str | None = None
) -> BlockRemoved | None:
    """The complete blocks lost when every token from position `start` on along `cut_paths` (the leaf paths
    through the cut) left the cache."""
    first = start // block_size
    hashes: dict[int, None] = {}
    for path in cut_paths:
        root = adapter_key(lora_name) if lora_name is not None else None
        hashes.update(dict.fromkeys(chain_hashes(path, block_size, root=root)[first:]))
    return BlockRemoved(block_hashes=list(hashes)) if hashes else None


class BlockView:
    """Turns token-path events into block events, keeping the token tree it needs to know what a removal cuts."""

    def __init__(self, block_size: int) -> None:
        from vriksha.kv_events.token_tree import TokenTree

        self.block_size = block_size
        self._tree_type = TokenTree
        self.trees: dict[str | None, TokenTree] = {None: TokenTree()}  # by adapter (None: the base model)

    @property
    def tree(self):
        return self.trees[None]

    def _tree(self, lora_name: str | None):
        if lora_name not in self.trees:
            self.trees[lora_name] = self._tree_type()
        return self.trees[lora_name]

    def stored(
        self, token_ids: list[int], num_cached: int, lora_name: str | None = None
    ) -> BlockStored | None:
        self._tree(lora_name).insert(token_ids)
        return stored_blocks(token_ids, num_cached, self.block_size, lora_name)

    def removed(
        self, token_ids: list[int], num_tokens: int, lora_name: str | None = None
    ) -> BlockRemoved | None:
        tree = self._tree(lora_name)
        start = len(token_ids) - num_tokens
        cut = tree.paths_below(token_ids, start)
        tree.remove(token_ids, num_tokens)
        return removed_blocks(cut, start, self.block_size, lora_name)

    def cleared(self) -> AllBlocksCleared:
        self.trees = {None: self._tree_type()}
        return AllBlocksCleared()
