"""The prefix tree over token ids whose nodes hold KV slots: match, insert, split, lock, evict (LRU).

Page size is one token. Every node owns the slots of its key; a slot is owned by exactly one node.
A locked node (lock_ref > 0) and, by construction, all its ancestors are protected from eviction.
An optional `CacheEventSink` hears of every run of tokens stored, removed (evicted, flushed) and of a reset.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vriksha.engine.core.cache_events import CacheEventSink
from vriksha.engine.core.kv_pool import SlotAllocator
from vriksha.errors import VrikshaError
from vriksha.prefix_tree import subtree, walk

_node_ids = itertools.count()


class RadixCacheError(VrikshaError, RuntimeError):
    """The radix cache was asked to do something its state forbids (flush while locked, unlock past zero)."""


@dataclass(eq=False, slots=True)
class TreeNode:
    key: list[int]
    value: torch.Tensor
    parent: TreeNode | None = None
    children: dict[int, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    id: int = field(default_factory=lambda: next(_node_ids))

    def __len__(self) -> int:
        return len(self.key)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def token_path(self) -> list[int]:
        """Every token from the root down to and including this node."""
        parts: list[list[int]] = []
        node: TreeNode | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return [t for part in reversed(parts) for t in part]


@dataclass(slots=True)
class MatchResult:
    slots: torch.Tensor
    last_node: TreeNode

    @property
    def length(self) -> int:
        return self.slots.numel()


@dataclass(slots=True)
class InsertResult:
    cached_len: int  # leading tokens that were cached before: the tree kept its own slots for them
    node: TreeNode  # the node that ends exactly at the last inserted token (lock it to keep them cached)
    _values: list[torch.Tensor]

    @property
    def cached_slots(self) -> torch.Tensor:
        """The tree's slots of the first `cached_len` tokens."""
        if not self._values:
            return torch.empty(0, dtype=torch.int64, device=self.node.value.device)
        return self._values[0] if len(self._values) == 1 else torch.cat(self._values)


def _as_list(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        return token_ids.flatten().tolist()
    return token_ids if isinstance(token_ids, list) else list(token_ids)


class RadixCache:
    def __init__(self, allocator: SlotAllocator, events: CacheEventSink | None = None) -> None:
        self.allocator = allocator
        self.events = events
        self._clock = itertools.count(1)
        self._empty = torch.empty(0, dtype=torch.int64, device=allocator.device)
        self._new_root()

    def _new_root(self) -> None:
        self.root = TreeNode(key=[], value=self._empty)
        self._evictable = 0
        self._protected = 0

    def match_prefix(self, token_ids: Sequence[int] | torch.Tensor) -> MatchResult:
        """The longest cached prefix of `token_ids`; `last_node` ends exactly where the match ends."""
        node, _, values = self._walk(_as_list(token_ids), next(self._clock))
        if not values:
            return MatchResult(self._empty, node)
        return MatchResult(values[0] if len(values) == 1 else torch.cat(values), node)

    def insert(self, token_ids: Sequence[int] | torch.Tensor, slots: torch.Tensor) -> InsertResult:
        """Cache `token_ids` with KV at `slots`; the result says how many leading tokens were already cached
        and which node ends at the last token.

        The tree keeps its own slots for those leading tokens (the caller frees its duplicates among
        `slots[:cached_len]`) and takes ownership of `slots[cached_len:]`.
        """
        tokens = _as_list(token_ids)
        if slots.numel() != len(tokens):
            raise RadixCacheError(
                f"insert got {len(tokens)} tokens but {slots.numel()} slots; pass one slot per token"
            )
        now = next(self._clock)
        node, pos, values = self._walk(tokens, now)
        if pos == len(tokens):
            return InsertResult(pos, node, values)
        leaf = TreeNode(
            key=tokens[pos:], value=slots[pos:].to(torch.int64).clone(), parent=node, last_access=now
        )
        node.children[tokens[pos]] = leaf
        self._evictable += len(leaf)
        if self.events is not None:
            self.events.stored(tokens[:pos], leaf.key, leaf.value)
        return InsertResult(pos, leaf, values)

    def _walk(self, tokens: list[int], now: int) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follow `tokens` down the tree, splitting where the match ends inside a node and stamping access
        times; returns the last node reached, the tokens matched and the slot tensors along the way."""
        self.root.last_access = now
        entered: list[TreeNode] = []
        node, pos = walk(self.root, tokens, now, self._split, entered)
        return node, pos, [n.value for n in entered]

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after its first `n` tokens; the new upper node inherits lock_ref and access time."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(
            key=child.key[:n],
            value=child.value[:n],
            parent=parent,
            children={child.key[n]: child},
            lock_ref=child.lock_ref,
            last_access=child.last_access,
        )
        parent.children[child.key[0]] = upper
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = upper
        return upper

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect `node` and all its ancestors from eviction."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node)
                self._protected += len(node)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                raise RadixCacheError(
                    "dec_lock_ref on an unlocked node; every unlock must pair with one lock"
                )
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node)
                self._evictable += len(node)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots (when that many are evictable) from unlocked leaves, least recently used first."""
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._nodes() if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            self.allocator.free(leaf.value)
            freed += len(leaf)
            self._evictable -= len(leaf)
            if self.events is not None:
                self.events.removed(parent.token_path(), leaf.key)
            del parent.children[leaf.key[0]]
            leaf.parent = None
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def flush_unlocked(self) -> int:
        """Free every unlocked node (locked nodes and their ancestors stay); returns the number of slots freed."""
        return self._flush(self.events)

    def _flush(self, events: CacheEventSink | None) -> int:
        freed = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for first, child in list(node.children.items()):
                if child.lock_ref > 0:
                    stack.append(child)
                    continue
                below = subtree(child)
                if below:
                    self.allocator.free(torch.cat([n.value for n in below]))
                size = sum(len(n) for n in below)
                freed += size
                self._evictable -= size
                if events is not None:
                    events.removed(node.token_path(), child.key)
                del node.children[first]
                child.parent = None
        return freed

    def reset(self) -> None:
        """Free every slot the tree holds and empty it; refuses while any node is locked."""
        if self._protected > 0:
            raise RadixCacheError(
                f"cannot reset the radix cache: {self._protected} tokens are locked by running requests; "
                "finish or abort them first, or call flush_unlocked()"
            )
        self._flush(None)
        assert not self.root.children and self._evictable == 0
        if self.events is not None:
            self.events.cleared()

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def leaf_paths(self) -> list[list[int]]:
        """The token path of every leaf: together they name every cached token (a KV-events snapshot)."""
        return [n.token_path() for n in self._nodes() if n.is_leaf]

    def slot_set(self) -> set[int]:
        return {s for n in self._nodes() for s in n.value.tolist()}

    def pretty(self) -> str:
        lines = [f"root evictable={self._evictable} protected={self._protected}"]
        stack = [(c, 1) for c in reversed(list(self.root.children.values()))]
        while stack:
            node, depth = stack.pop()
            lines.append(
                f"{'  ' * depth}{node.key} slots={node.value.tolist()} lock={node.lock_ref} t={node.last_access}"
            )
            stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
        return "\n".join(lines)

    def _nodes(self) -> list[TreeNode]:
        """Every node except the root."""
        return subtree(self.root)[1:]
