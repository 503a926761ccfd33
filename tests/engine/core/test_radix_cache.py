from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vriksha.engine.core.kv_pool import SlotAllocator
from vriksha.engine.core.radix_cache import RadixCache, RadixCacheError, TreeNode
from vriksha.errors import VrikshaError


def make(num_slots: int = 64) -> tuple[SlotAllocator, RadixCache]:
    alloc = SlotAllocator(num_slots)
    return alloc, RadixCache(alloc)


def put(alloc: SlotAllocator, cache: RadixCache, tokens: list[int]) -> torch.Tensor:
    """Insert `tokens` with fresh slots, freeing the duplicates as a scheduler would; returns the fresh slots."""
    slots = alloc.alloc(len(tokens))
    assert slots is not None
    n = cache.insert(tokens, slots).cached_len
    alloc.free(slots[:n])
    return slots


def tree_map(cache: RadixCache) -> dict[tuple[int, ...], int]:
    """Every cached token prefix -> the slot of its last token, by walking the tree without touching it."""
    out: dict[tuple[int, ...], int] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(cache.root, ())]
    while stack:
        node, prefix = stack.pop()
        assert len(node.key) == node.value.numel()
        for tok, slot in zip(node.key, node.value.tolist(), strict=True):
            prefix = (*prefix, tok)
            out[prefix] = slot
        for first, child in node.children.items():
            assert child.key[0] == first and child.parent is node and len(child.key) > 0
            stack.append((child, prefix))
    return out


def locked_tokens(cache: RadixCache) -> int:
    return sum(len(n.key) for n in cache._nodes() if n.lock_ref > 0)


# ---------------------------------------------------------------- unit tests


def test_empty_tree_and_empty_input():
    alloc, cache = make()
    m = cache.match_prefix([])
    assert m.slots.numel() == 0 and m.slots.dtype == torch.int64 and m.last_node is cache.root
    assert cache.match_prefix([1, 2, 3]).last_node is cache.root
    assert cache.insert([], torch.empty(0, dtype=torch.int64)).cached_len == 0
    assert cache.total_size() == 0 and cache.slot_set() == set()


def test_insert_then_match_returns_inserted_slots():
    alloc, cache = make()
    slots = put(alloc, cache, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert m.slots.tolist() == slots.tolist()
    assert m.length == 4 and m.last_node.key == [1, 2, 3, 4]
    assert cache.total_size() == 4 and cache.evictable_size() == 4
    assert cache.slot_set() == set(slots.tolist())


def test_match_inside_node_splits_it():
    alloc, cache = make()
    slots = put(alloc, cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.slots.tolist() == slots[:3].tolist()
    assert m.last_node.key == [1, 2, 3] and m.last_node.token_path() == [1, 2, 3]
    (child,) = m.last_node.children.values()
    assert child.key == [4, 5] and child.value.tolist() == slots[3:].tolist() and child.parent is m.last_node
    assert cache.total_size() == 5
    assert tree_map(cache)[(1, 2, 3, 4, 5)] == slots[4].item()


def test_insert_reports_cached_prefix_and_owns_only_the_rest():
    alloc, cache = make()
    first = put(alloc, cache, [1, 2, 3, 4])
    second = alloc.alloc(5)
    result = cache.insert([1, 2, 7, 8, 9], second)
    n = result.cached_len
    assert n == 2
    assert result.cached_slots.tolist() == first[:2].tolist()
    assert result.node.token_path() == [1, 2, 7, 8, 9] and result.node.key == [7, 8, 9]
    alloc.free(second[:n])
    assert cache.slot_set() == set(first.tolist()) | set(second[2:].tolist())
    assert cache.match_prefix([1, 2, 7, 8, 9]).slots.tolist() == first[:2].tolist() + second[2:].tolist()
    again = cache.insert([1, 2, 3, 4], alloc.alloc(4))
    assert again.cached_len == 4  # fully cached already: nothing new owned
    assert again.node.token_path() == [1, 2, 3, 4] and again.cached_slots.tolist() == first.tolist()
    assert cache.insert([1, 2, 3], alloc.alloc(3)).node.token_path() == [1, 2, 3]  # ends inside a node: split
    assert cache.total_size() == 7


def test_insert_rejects_mismatched_slot_count():
    _, cache = make()
    with pytest.raises(VrikshaError, match="one slot per token"):
        cache.insert([1, 2, 3], torch.tensor([1, 2]))


def test_insert_accepts_tensor_token_ids():
    alloc, cache = make()
    slots = put(alloc, cache, [5, 6, 7])
    assert cache.match_prefix(torch.tensor([5, 6, 7, 8])).slots.tolist() == slots.tolist()


def test_lock_protects_node_and_ancestors_from_eviction():
    alloc, cache = make()
    a = put(alloc, cache, [1, 2, 3, 4])
    b = put(alloc, cache, [1, 2, 5, 6])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 4 and cache.evictable_size() == 2
    assert cache.evict(100) == 2
    assert set(b[2:].tolist()) <= alloc.free_slot_set()
    assert cache.slot_set() == set(a.tolist())
    cache.dec_lock_ref(m.last_node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    assert cache.evict(100) == 4 and cache.total_size() == 0
    assert alloc.num_free == alloc.capacity


def test_lock_counts_nest_and_unlock_past_zero_raises():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    assert cache.protected_size() == 3 and cache.evict(3) == 0
    cache.dec_lock_ref(node)
    with pytest.raises(RadixCacheError):
        cache.dec_lock_ref(node)


def test_split_of_locked_node_keeps_lock_on_both_parts():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    upper = cache.match_prefix([1, 2, 9]).last_node
    assert upper.key == [1, 2] and upper.lock_ref == 1 and node.lock_ref == 1 and node.parent is upper
    assert cache.protected_size() == 4 and cache.evictable_size() == 0
    cache.dec_lock_ref(node)
    assert upper.lock_ref == 0 and cache.protected_size() == 0 and cache.evictable_size() == 4


def test_evict_follows_lru_order():
    alloc, cache = make()
    old = put(alloc, cache, [1, 1])
    mid = put(alloc, cache, [2, 2])
    new = put(alloc, cache, [3, 3])
    cache.match_prefix([1, 1])  # touch: [2, 2] is now the least recently used
    assert cache.evict(1) == 2
    assert set(mid.tolist()) <= alloc.free_slot_set()
    assert cache.evict(1) == 2
    assert set(new.tolist()) <= alloc.free_slot_set()
    assert cache.slot_set() == set(old.tolist())


def test_evict_climbs_to_parent_that_becomes_a_leaf():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 2, 4])  # tree: [1,2] -> {[3], [4]}
    other = put(alloc, cache, [7, 7, 7, 7])
    cache.match_prefix([7, 7, 7, 7])  # the [1,2] branch is older
    assert cache.evict(4) == 4  # [3], [4], then their parent [1,2]
    assert cache.slot_set() == set(other.tolist())
    assert cache.match_prefix([1, 2]).length == 0


def test_evict_frees_whole_leaves_at_least_requested():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4, 5])
    assert cache.evict(2) == 5
    assert cache.evict(0) == 0 and cache.evict(3) == 0


def test_reset_frees_everything_and_refuses_while_locked():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [4, 5])
    node = cache.match_prefix([4, 5]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(RadixCacheError, match="locked"):
        cache.reset()
    assert cache.flush_unlocked() == 3
    assert cache.total_size() == 2 and cache.slot_set() == set(node.value.tolist())
    cache.dec_lock_ref(node)
    cache.reset()
    assert cache.total_size() == 0 and cache.slot_set() == set() and cache.root.children == {}
    assert alloc.num_free == alloc.capacity
    assert cache.match_prefix([4, 5]).length == 0


def test_long_prompt_match():
    alloc, cache = make(num_slots=20_001)
    tokens = list(range(10_000))
    slots = put(alloc, cache, tokens)
    probe = tokens[:7_000] + [-1]
    m = cache.match_prefix(probe)
    assert m.length == 7_000 and torch.equal(m.slots, slots[:7_000])
    assert "lock=0" in cache.pretty()


def test_evict_lru_across_branches():
    alloc, cache = make()
    a = put(alloc, cache, [1, 2, 3])
    b = put(alloc, cache, [9])
    c = put(alloc, cache, [1, 2, 4])  # splits [1,2,3]: [1,2] -> {[3] oldest, [4] newest}
    assert cache.evict(2) == 2
    assert {a[2].item(), b[0].item()} <= alloc.free_slot_set()
    assert cache.slot_set() == {a[0].item(), a[1].item(), c[2].item()}


def test_tree_owns_a_copy_of_inserted_slots():
    alloc, cache = make()
    slots = alloc.alloc(3)
    expect = slots.tolist()
    cache.insert([1, 2, 3], slots)
    slots.fill_(0)  # the caller reuses its buffer
    assert cache.match_prefix([1, 2, 3]).slots.tolist() == expect


# ---------------------------------------------------------------- stateful property test

NUM_SLOTS = 32
token_seqs = st.lists(st.integers(0, 2), min_size=0, max_size=9)


class Mirror:
    """A cache's contents rebuilt from its events alone, as a router would: cached path -> slot of its last token."""

    def __init__(self) -> None:
        self.paths: dict[tuple[int, ...], int] = {}

    def stored(self, parent, token_ids, slots) -> None:
        assert tuple(parent) in self.paths or not parent, "stored under a path the mirror never saw"
        for i, slot in enumerate(slots.tolist()):
            path = (*parent, *token_ids[: i + 1])
            assert path not in self.paths, "stored a path twice"
            self.paths[path] = slot

    def removed(self, parent, token_ids) -> None:
        top = (*parent, token_ids[0])  # the run's first token on: every path through it
        gone = [p for p in self.paths if p[: len(top)] == top]
        assert (*parent, *token_ids) in gone
        assert gone, "removed a path the mirror does not hold"
        for p in gone:
            del self.paths[p]

    def cleared(self) -> None:
        self.paths.clear()


class RadixCacheMachine(RuleBasedStateMachine):
    """A scheduler's use of the cache against a reference model.

    `ref` maps every cached token prefix to the slot of its last token, `touched` to the reference clock tick
    of its last match or insert; `requests` are the running requests and the slots they own.
    """

    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(NUM_SLOTS)
        self.mirror = Mirror()
        self.cache = RadixCache(self.alloc, events=self.mirror)
        self.ref: dict[tuple[int, ...], int] = {}
        self.touched: dict[tuple[int, ...], int] = {}
        self.tick = 0
        # each running request: tokens, all its slots, the locked node, how many leading slots the tree owns
        self.requests: list[tuple[list[int], torch.Tensor, TreeNode, int]] = []

    def _longest_cached(self, tokens: list[int]) -> int:
        n = 0
        while n < len(tokens) and tuple(tokens[: n + 1]) in self.ref:
            n += 1
        return n

    def _touch(self, tokens: list[int], n: int) -> None:
        self.tick += 1
        for i in range(n):
            self.touched[tuple(tokens[: i + 1])] = self.tick

    def _match(self, tokens: list[int]):
        expect = self._longest_cached(tokens)
        m = self.cache.match_prefix(tokens)
        self._touch(tokens, expect)
        assert m.length == expect
        assert m.slots.tolist() == [self.ref[tuple(tokens[: i + 1])] for i in range(expect)]
        assert m.last_node.token_path() == tokens[:expect]
        return m

    def _insert(self, tokens: list[int], slots: torch.Tensor, owned: int) -> int:
        """Insert a request's tokens, free its duplicates, return how many were cached before."""
        expect = self._longest_cached(tokens)
        result = self.cache.insert(tokens, slots)
        n = result.cached_len
        assert n == expect and n >= owned
        assert result.node.token_path() == tokens
        assert result.cached_slots.tolist() == [self.ref[tuple(tokens[: i + 1])] for i in range(n)]
        assert all(self.ref[tuple(tokens[: i + 1])] == slots[i].item() for i in range(owned))
        self.alloc.free(slots[owned:n])
        for i in range(n, len(tokens)):
            self.ref[tuple(tokens[: i + 1])] = slots[i].item()
        self._touch(tokens, len(tokens))
        return n

    def _evict(self, k: int) -> int:
        evictable = self.cache.evictable_size()
        freed = self.cache.evict(k)
        assert min(k, evictable) <= freed <= evictable
        free = self.alloc.free_slot_set()
        gone = [p for p, s in self.ref.items() if s in free]
        assert len(gone) == freed
        if gone:
            newest_gone = max(self.touched[p] for p in gone)
            for node in self.cache._nodes():
                if node.is_leaf and node.lock_ref == 0:
                    assert self.touched[tuple(node.token_path())] >= newest_gone, "evicted out of LRU order"
        for p in gone:
            del self.ref[p], self.touched[p]
        return freed

    def _alloc(self, n: int) -> torch.Tensor | None:
        fresh = self.alloc.alloc(n)
        if fresh is None:
            self._evict(n - self.alloc.num_free)
            fresh = self.alloc.alloc(n)
        if fresh is None:
            assert self.alloc.num_free + self.cache.evictable_size() < n
        return fresh

    @rule(tokens=token_seqs)
    def match_only(self, tokens):
        self._match(tokens)

    @rule(tokens=token_seqs)
    def start_request(self, tokens):
        m = self._match(tokens)
        self.cache.inc_lock_ref(m.last_node)
        fresh = self._alloc(len(tokens) - m.length)
        if fresh is None:
            self.cache.dec_lock_ref(m.last_node)
            return
        self.requests.append((tokens, torch.cat([m.slots, fresh]), m.last_node, m.length))

    @rule(tokens=token_seqs)
    def run_request_to_completion(self, tokens):
        m = self._match(tokens)
        self.cache.inc_lock_ref(m.last_node)
        fresh = self._alloc(len(tokens) - m.length)
        if fresh is not None:
            self._insert(tokens, torch.cat([m.slots, fresh]), m.length)
        self.cache.dec_lock_ref(m.last_node)

    @precondition(lambda self: self.requests)
    @rule(idx=st.integers(0, 100), more=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def decode(self, idx, more):
        i = idx % len(self.requests)
        tokens, slots, node, owned = self.requests[i]
        fresh = self._alloc(len(more))
        if fresh is not None:
            self.requests[i] = (tokens + more, torch.cat([slots, fresh]), node, owned)

    @precondition(lambda self: self.requests)
    @rule(idx=st.integers(0, 100))
    def cache_unfinished(self, idx):
        """Chunked prefill: cache what the request has so far and move its lock down to the new last node."""
        i = idx % len(self.requests)
        tokens, slots, node, owned = self.requests[i]
        n = self._insert(tokens, slots, owned)
        m = self._match(tokens)
        assert m.length == len(tokens) and m.slots[n:].tolist() == slots[n:].tolist()
        self.cache.inc_lock_ref(m.last_node)
        self.cache.dec_lock_ref(node)
        self.requests[i] = (tokens, m.slots, m.last_node, len(tokens))

    @precondition(lambda self: self.requests)
    @rule(idx=st.integers(0, 100), cache_it=st.booleans())
    def finish_request(self, idx, cache_it):
        tokens, slots, node, owned = self.requests.pop(idx % len(self.requests))
        if cache_it:
            self._insert(tokens, slots, owned)
        else:
            self.alloc.free(slots[owned:])
        self.cache.dec_lock_ref(node)

    @rule(k=st.integers(1, 8))
    def evict(self, k):
        self._evict(k)

    @rule()
    def flush_unlocked(self):
        evictable = self.cache.evictable_size()
        assert self.cache.flush_unlocked() == evictable
        assert self.cache.evictable_size() == 0
        free = self.alloc.free_slot_set()
        gone = [p for p, s in self.ref.items() if s in free]
        assert len(gone) == evictable
        for p in gone:
            del self.ref[p], self.touched[p]

    @rule()
    def reset(self):
        if self.cache.protected_size() > 0:
            with pytest.raises(RadixCacheError):
                self.cache.reset()
            return
        self.cache.reset()
        assert self.alloc.free_slot_set() >= set(self.ref.values())
        self.ref.clear()
        self.touched.clear()

    @invariant()
    def slots_partitioned(self):
        free = self.alloc.free_slot_set()
        tree = self.cache.slot_set()
        held: list[int] = []
        for _, slots, _, owned in self.requests:
            held += slots[owned:].tolist()
        assert len(free) == self.alloc.num_free
        assert len(set(held)) == len(held)
        assert not (free & tree) and not (free & set(held)) and not (tree & set(held))
        assert free | tree | set(held) == set(range(1, NUM_SLOTS))

    @invariant()
    def tree_matches_reference(self):
        assert tree_map(self.cache) == self.ref
        assert self.mirror.paths == self.ref, "the event mirror drifted from the tree"
        assert self.cache.total_size() == len(self.ref)
        assert self.cache.protected_size() == locked_tokens(self.cache)

    @invariant()
    def access_times_mirror_reference(self):
        """Each node's tokens were touched together, and the nodes' LRU order is the reference's."""
        order: dict[int, int] = {}
        for node in self.cache._nodes():
            path = node.token_path()
            ticks = {
                self.touched[tuple(path[:i])] for i in range(len(path) - len(node.key) + 1, len(path) + 1)
            }
            assert len(ticks) == 1
            assert order.setdefault(node.last_access, ticks.pop()) == self.touched[tuple(path)]
        ordered = [order[t] for t in sorted(order)]
        assert ordered == sorted(set(ordered))

    @invariant()
    def running_prefixes_stay_cached(self):
        for tokens, slots, node, owned in self.requests:
            assert node is self.cache.root or node.lock_ref > 0
            assert node.token_path() == tokens[:owned]
            for i in range(owned):
                assert self.ref[tuple(tokens[: i + 1])] == slots[i].item()


RadixCacheMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRadixCacheMachine = RadixCacheMachine.TestCase
