"""The prefix tree over token ids whose nodes hold KV slots: match, insert, split, lock, evict (LRU).

Page size is one token. Every node owns the slots of its key; a slot is owned by exactly one node.
A locked node (lock_ref > 0) and, by construction, all its ancestors are protected from eviction.
An optional `CacheEventSink` hears of every run of tokens stored, removed (evicted, flushed) and of a reset.

With a second KV tier (`KVTier`), eviction writes a node's K/V to the tier instead of dropping it: the node
stays in the tree with `host` set and no slots, and a match through it loads it back into fresh slots. A node
in the tier has only tier nodes below it and is never locked; the tier drops its own least recently used
leaves when it is full. Tier moves reach the sink as `moved` (the path stays cached); a drop from the tier
as `removed`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vriksha.engine.core.cache_events import CacheEventSink
from vriksha.engine.core.kv_pool import SlotAllocator
from vriksha.engine.core.kv_tier import HostKV, KVTier
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
    host: HostKV | None = None  # its K/V in the second tier (value is then empty)
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
    def __init__(
        self, allocator: SlotAllocator, events: CacheEventSink | None = None, tier: KVTier | None = None
    ) -> None:
        self.allocator = allocator
        self.events = events
        self.tier = tier
        self._loading: frozenset[int] = frozenset()  # ids of tier nodes being loaded (not to be dropped)
        self._clock = itertools.count(1)
        self._empty = torch.empty(0, dtype=torch.int64, device=allocator.device)
        self._new_root()

    def _new_root(self) -> None:
        self.root = TreeNode(key=[], value=self._empty)
        self._evictable = 0
        self._protected = 0
        self._host = 0  # tokens of this tree in the tier

    def match_prefix(self, token_ids: Sequence[int] | torch.Tensor, load: bool = False) -> MatchResult:
        """The longest prefix of `token_ids` in the pool; `last_node` ends exactly where the match ends.
        `load`: nodes in the second tier along the way are loaded back into the pool (when slots can be
        had) and count as matched."""
        entered: list[TreeNode] = []
        node, _ = walk(self.root, _as_list(token_ids), self._tick(), self._split, entered)
        first_host = next((i for i, n in enumerate(entered) if n.host is not None), None)
        if first_host is not None:
            node = entered[first_host - 1] if first_host else self.root
            if load and self._load(node, entered[first_host:]):
                node = entered[-1]
            else:
                entered = entered[:first_host]
        values = [n.value for n in entered]
        if not values:
            return MatchResult(self._empty, node)
        return MatchResult(values[0] if len(values) == 1 else torch.cat(values), node)

    def _tick(self) -> int:
        now = next(self._clock)
        self.root.last_access = now
        return now

    def _load(self, above: TreeNode, hosts: list[TreeNode]) -> bool:
        """Copy the tier nodes `hosts` (a path below `above`) back into fresh pool slots."""
        assert self.tier is not None
        n = sum(len(h) for h in hosts)
        if n > self.allocator.num_free + self._evictable:
            return False
        self.inc_lock_ref(above)  # eviction to make room must spare the path and the nodes being loaded
        self._loading = frozenset(h.id for h in hosts)
        try:
            if n > self.allocator.num_free:
                self.evict(n - self.allocator.num_free)
            slots = self.allocator.alloc(n)
        finally:
            self._loading = frozenset()
            self.dec_lock_ref(above)
        if slots is None:
            return False
        offset = 0
        for h in hosts:
            assert h.host is not None
            part = slots[offset : offset + len(h)]
            self.tier.load(h.host, part)
            self._to_pool(h, part)
            offset += len(h)
        return True

    def _to_pool(self, node: TreeNode, slots: torch.Tensor) -> None:
        node.host = None
        node.value = slots.to(torch.int64).clone()
        self._host -= len(node)
        self._evictable += len(node)
        self._moved(node, "pool")

    def _moved(self, node: TreeNode, medium: str) -> None:
        moved = getattr(self.events, "moved", None)
        if moved is not None:
            assert node.parent is not None
            moved(node.parent.token_path(), node.key, medium)

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
        entered: list[TreeNode] = []
        self.root.last_access = now
        node, pos = walk(self.root, tokens, now, self._split, entered)
        first_host = next((i for i, n in enumerate(entered) if n.host is not None), None)
        if (
            first_host is not None
        ):  # computed again before a hit loaded it: the fresh copy replaces the tier's
            start = sum(len(n) for n in entered[:first_host])
            for h in entered[first_host:]:
                assert h.host is not None and self.tier is not None
                self.tier.forget(h.host)
                self._to_pool(h, slots[start : start + len(h)])
                start += len(h)
            entered = entered[:first_host]
            pos_cached = sum(len(n) for n in entered)
            values = [n.value for n in entered]
            if pos == len(tokens):
                return InsertResult(pos_cached, node, values)
        else:
            values = [n.value for n in entered]
            pos_cached = pos
            if pos == len(tokens):
                return InsertResult(pos, node, values)
        leaf = TreeNode(
            key=tokens[pos:], value=slots[pos:].to(torch.int64).clone(), parent=node, last_access=now
        )
        node.children[tokens[pos]] = leaf
        self._evictable += len(leaf)
        if self.events is not None:
            self.events.stored(tokens[:pos], leaf.key, leaf.value)
        return InsertResult(pos_cached, leaf, values)

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
        if child.host is not None:
            upper.host = child.host.slice(0, n)
            child.host = child.host.slice(n, child.host.num_tokens)
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
        """Free at least `num_tokens` slots (when that many are evictable) from unlocked leaves of the pool
        (nodes with no child in the pool), least recently used first: to the second tier when there is one and
        it has room, else dropped (with what the tier holds below them)."""
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._nodes() if self._pool_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            freed += len(leaf)
            if not self._write_back(leaf):
                self._drop(leaf)
            if parent is not self.root and self._pool_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _pool_leaf(self, node: TreeNode) -> bool:
        return (
            node.host is None
            and node.lock_ref == 0
            and all(c.host is not None for c in node.children.values())
        )

    def _write_back(self, node: TreeNode) -> bool:
        """Move `node`'s K/V from the pool to the tier (making room there by dropping its least recently
        used leaves); False when there is no tier or no room."""
        tier, n = self.tier, len(node)
        if tier is None or n > tier.capacity:
            return False
        if tier.num_free < n:
            leaves = [
                (h.last_access, h.id, h)
                for h in self._nodes()
                if h.host is not None and h.is_leaf and h.id not in self._loading
            ]
            heapq.heapify(leaves)
            while tier.num_free < n and leaves:
                _, _, h = heapq.heappop(leaves)
                up = h.parent
                self._drop(h)
                if up is not None and up is not self.root and up.host is not None and up.is_leaf:
                    heapq.heappush(leaves, (up.last_access, up.id, up))
            if tier.num_free < n:
                return False
        node.host = tier.store(node.value)
        self.allocator.free(node.value)
        node.value = self._empty
        self._evictable -= n
        self._host += n
        self._moved(node, tier.medium)
        return True

    def _drop(self, top: TreeNode) -> int:
        """Remove `top` (unlocked) and everything below it from the tree; returns the pool slots freed."""
        parent = top.parent
        assert parent is not None and top.lock_ref == 0
        below = subtree(top)
        in_pool = [n for n in below if n.host is None]
        if in_pool:
            self.allocator.free(torch.cat([n.value for n in in_pool]))
        for n in below:
            if n.host is not None:
                assert self.tier is not None
                self.tier.drop(n.host)
                self._host -= len(n)
        size = sum(len(n) for n in in_pool)
        self._evictable -= size
        if self.events is not None:
            self.events.removed(parent.token_path(), top.key)
        del parent.children[top.key[0]]
        top.parent = None
        return size

    def flush_unlocked(self) -> int:
        """Free every unlocked node (locked nodes and their ancestors stay); returns the number of slots freed."""
        return self._flush(self.events)

    def _flush(self, events: CacheEventSink | None) -> int:
        freed = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in list(node.children.values()):
                if child.lock_ref > 0:
                    stack.append(child)
                    continue
                sink, self.events = self.events, events
                try:
                    freed += self._drop(child)
                finally:
                    self.events = sink
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

    def tier_size(self) -> int:
        """Tokens of this tree whose K/V is in the second tier."""
        return self._host

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
                + (" tier" if node.host is not None else "")
            )
            stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
        return "\n".join(lines)

    def _nodes(self) -> list[TreeNode]:
        """Every node except the root."""
        return subtree(self.root)[1:]
