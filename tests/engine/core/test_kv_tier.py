"""The second KV tier under the radix tree: evicted prefixes move to the tier and come back on a hit with
their K/V intact (exactly with float32, within int8's rounding), the tier's books and the slot ownership
invariant hold, and the tier's moves reach the event sink while the paths stay cached."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from vriksha.engine.core.kv_layout import KVLayout, LayerKV
from vriksha.engine.core.kv_pool import KVPool, SlotAllocator
from vriksha.engine.core.kv_tier import KVTier, quantize
from vriksha.engine.core.radix_cache import RadixCache
from vriksha.errors import ConfigError
from vriksha.prefix_tree import subtree

NUM_SLOTS = 24
LAYOUT = KVLayout((LayerKV(2, 4, 4), LayerKV(1, 4, 3)))


def kv_of(path: tuple[int, ...], layer: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The K (or V, shape differs) a 'forward' computes for the last token of `path`: a function of the path."""
    g = torch.Generator().manual_seed(hash((path, layer, shape)) % 2**31)
    return torch.randn(shape, generator=g)


class Events:
    def __init__(self) -> None:
        self.paths: set[tuple[int, ...]] = set()
        self.moves: list[tuple[tuple[int, ...], str]] = []

    def stored(self, parent, token_ids, slots) -> None:
        for i in range(len(token_ids)):
            self.paths.add((*parent, *token_ids[: i + 1]))

    def removed(self, parent, token_ids) -> None:
        top = (*parent, token_ids[0])
        self.paths = {p for p in self.paths if p[: len(top)] != top}

    def moved(self, parent, token_ids, medium) -> None:
        self.moves.append(((*parent, *token_ids), medium))

    def cleared(self) -> None:
        self.paths.clear()


class Cache:
    """A radix cache over a real KV pool with a tier; `compute` writes each token's path-determined K/V."""

    def __init__(self, tier_tokens: int, dtype: str) -> None:
        self.pool = KVPool(LAYOUT, NUM_SLOTS, torch.float32)
        self.alloc = SlotAllocator(NUM_SLOTS)
        self.tier = KVTier(self.pool, tier_tokens, dtype)
        self.events = Events()
        self.cache = RadixCache(self.alloc, self.events, self.tier)

    def write(self, tokens: list[int], slots: torch.Tensor, start: int) -> None:
        for i in range(start, len(tokens)):
            path = tuple(tokens[: i + 1])
            for layer, x in enumerate(LAYOUT.layers):
                self.pool.k[layer][slots[i]] = kv_of(path, layer, (x.kv_heads, x.k_dim))
                self.pool.v[layer][slots[i]] = kv_of(path, layer, (x.kv_heads, x.v_dim))

    def run(self, tokens: list[int]) -> int | None:
        """Match (loading from the tier), compute the rest, insert; returns the tokens matched, None when the
        pool had no room."""
        m = self.cache.match_prefix(tokens, load=True)
        self.cache.inc_lock_ref(m.last_node)
        need = len(tokens) - m.length
        if need > self.alloc.num_free:
            self.cache.evict(need - self.alloc.num_free)
        fresh = self.alloc.alloc(need)
        if fresh is None:
            self.cache.dec_lock_ref(m.last_node)
            return None
        slots = torch.cat([m.slots, fresh])
        self.write(tokens, slots, m.length)
        result = self.cache.insert(tokens, slots)
        self.alloc.free(slots[m.length : result.cached_len])
        self.cache.dec_lock_ref(m.last_node)
        return m.length

    def check_kv(self, tokens: list[int], atol: float) -> None:
        m = self.cache.match_prefix(tokens)
        for i, slot in enumerate(m.slots.tolist()):
            path = tuple(tokens[: i + 1])
            for layer, x in enumerate(LAYOUT.layers):
                want = kv_of(path, layer, (x.kv_heads, x.k_dim))
                torch.testing.assert_close(self.pool.k[layer][slot], want, atol=atol, rtol=0)


def test_an_evicted_prefix_is_loaded_back_not_recomputed_and_exact_in_float32():
    c = Cache(tier_tokens=40, dtype="float32")
    a = list(range(100, 112))
    assert c.run(a) == 0
    assert c.cache.evict(12) == 12
    assert c.alloc.num_free == NUM_SLOTS - 1 and c.cache.tier_size() == 12 and c.tier.used == 12
    assert c.cache.match_prefix(a).length == 0  # without load: nothing in the pool
    assert c.events.paths == {tuple(a[: i + 1]) for i in range(12)}  # the path stays cached for a mirror
    assert c.events.moves[-1] == (tuple(a), "cpu-float32")
    assert c.run(a + [7, 8]) == 12  # loaded back: 12 matched, 2 computed
    assert c.tier.counters.loaded_tokens == 12 and c.tier.used == 0
    assert c.events.moves[-1] == (tuple(a), "pool")
    c.check_kv(a + [7, 8], atol=0.0)


def test_int8_tier_is_within_its_rounding_and_quantize_bounds_the_error():
    x = torch.randn(5, 2, 8) * 3
    q, scale = quantize(x)
    assert q.dtype == torch.int8 and scale.shape == (5, 2, 1)
    assert (q.float() * scale - x).abs().max() <= scale.max() / 2 + 1e-6
    c = Cache(tier_tokens=40, dtype="int8")
    a = list(range(50, 60))
    c.run(a)
    c.cache.evict(10)
    assert c.run(a + [1]) == 10
    c.check_kv(a, atol=4.0 / 127 / 2 + 1e-6)  # |x| < ~4 for these draws: half a step of its scale


def test_a_full_tier_drops_its_least_recently_used_leaf_and_says_so():
    c = Cache(tier_tokens=10, dtype="float32")
    a, b = [1] * 0 + list(range(10, 16)), list(range(20, 26))
    c.run(a)
    c.run(b)
    c.cache.evict(6)  # a (older) to the tier
    c.cache.evict(6)  # b needs room: a leaves the tier
    assert c.cache.tier_size() == 6 and not any(p[0] == 10 for p in c.events.paths)
    assert c.tier.counters.dropped_tokens == 6
    assert c.run(a) == 0 and c.run(b) == 6


def test_an_insert_that_reaches_tier_nodes_first_replaces_them_with_its_own_slots():
    c = Cache(tier_tokens=40, dtype="float32")
    a = list(range(30, 38))
    c.run(a)
    c.cache.evict(8)
    slots = c.alloc.alloc(10)
    c.write(a + [1, 2], slots, 0)
    result = c.cache.insert(a + [1, 2], slots)
    assert result.cached_len == 0 and c.tier.used == 0 and c.cache.tier_size() == 0
    assert c.cache.match_prefix(a + [1, 2]).slots.tolist() == slots.tolist()


def test_bad_tier_sizes_and_dtypes_are_named():
    pool = KVPool(LAYOUT, 4, torch.float32)
    with pytest.raises(ConfigError, match="int8 or float32"):
        KVTier(pool, 8, "fp8")
    with pytest.raises(ConfigError, match="0 turns it off"):
        KVTier(pool, 0)


class TierMachine(RuleBasedStateMachine):
    """Runs, evictions and flushes with a small pool and tier: slots are owned once, the tier's books add up,
    tier nodes sit below pool nodes only and are never locked, and every cached token's K/V is its own."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Cache(tier_tokens=16, dtype="float32")

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=12))
    def run(self, tokens):
        self.c.run(tokens)
        self.c.check_kv(tokens, atol=0.0)

    @rule(k=st.integers(1, 12))
    def evict(self, k):
        evictable = self.c.cache.evictable_size()
        freed = self.c.cache.evict(k)
        assert min(k, evictable) <= freed <= evictable

    @rule()
    def flush(self):
        self.c.cache.flush_unlocked()
        assert self.c.tier.used == 0 and self.c.cache.total_size() == 0

    @invariant()
    def books(self):
        cache, tier = self.c.cache, self.c.tier
        nodes = subtree(cache.root)[1:]
        free, tree = self.c.alloc.free_slot_set(), cache.slot_set()
        assert not (free & tree) and free | tree == set(range(1, NUM_SLOTS))
        hosted = sum(len(n) for n in nodes if n.host is not None)
        assert tier.used == cache.tier_size() == hosted <= tier.capacity
        for n in nodes:
            if n.host is not None:
                assert n.lock_ref == 0 and n.value.numel() == 0 and n.host.num_tokens == len(n)
                assert all(c.host is not None for c in subtree(n))
            else:
                assert n.value.numel() == len(n)
        assert self.c.events.paths == {
            tuple(n.token_path()[:i]) for n in nodes for i in range(1, len(n.token_path()) + 1)
        }


TierMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTierMachine = TierMachine.TestCase
