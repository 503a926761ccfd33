"""The router's mirror equals the engine's radix tree after any sequence of tree operations, replayed through
the encoded event stream; the vLLM block stream names exactly the complete blocks the tree holds."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from vriksha.engine.core.kv_layout import KVLayout, LayerKV
from vriksha.engine.core.kv_pool import KVPool, SlotAllocator
from vriksha.engine.core.kv_tier import KVTier
from vriksha.engine.core.radix_cache import RadixCache
from vriksha.kv_events.schema import (
    AllCleared,
    EventBatch,
    PrefixMoved,
    PrefixRemoved,
    PrefixStored,
    decode_batch,
    encode_batch,
)
from vriksha.kv_events.token_tree import TokenTree
from vriksha.kv_events.vllm_blocks import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockView,
)
from vriksha.kv_events.vllm_blocks import chain_hashes as vllm_chain

BLOCK = 4


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def stored(self, parent, token_ids, slots) -> None:
        self.events.append(PrefixStored([*parent, *token_ids], len(parent)))

    def removed(self, parent, token_ids) -> None:
        self.events.append(PrefixRemoved([*parent, *token_ids], len(token_ids)))

    def moved(self, parent, token_ids, medium) -> None:
        self.events.append(PrefixMoved([*parent, *token_ids], len(token_ids), medium))

    def cleared(self) -> None:
        self.events.append(AllCleared())


def expected_blocks(cache: RadixCache) -> set[int]:
    return {h for path in cache.leaf_paths() for h in vllm_chain(path, BLOCK)}


tokens = st.lists(st.integers(0, 3), min_size=1, max_size=12)


class MirrorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(96)
        self.cache = RadixCache(self.alloc)
        self.rec = Recorder()
        self.cache.events = self.rec
        self.mirror = TokenTree()
        self.blocks: set[int] = set()
        self.view = BlockView(BLOCK)
        self.locked: list = []
        self.moves = 0

    def _sync(self) -> None:
        if not self.rec.events:
            return
        batch = decode_batch(encode_batch(EventBatch(0.0, self.rec.events, "i")))
        self.rec.events = []
        for ev in batch.events:
            if isinstance(ev, PrefixStored):
                self.mirror.insert(ev.token_ids)
                b = self.view.stored(ev.token_ids, ev.num_cached)
                if b is not None:
                    assert isinstance(b, BlockStored) and len(b.token_ids) == BLOCK * len(b.block_hashes)
                    self.blocks |= set(b.block_hashes)
            elif isinstance(ev, PrefixRemoved):
                self.mirror.remove(ev.token_ids, ev.num_tokens)
                b = self.view.removed(ev.token_ids, ev.num_tokens)
                if b is not None:
                    assert isinstance(b, BlockRemoved)
                    self.blocks -= set(b.block_hashes)
            elif isinstance(ev, PrefixMoved):
                self.moves += 1  # the path stays cached: the mirror keeps scoring it
            else:
                self.mirror.clear()
                assert isinstance(self.view.cleared(), AllBlocksCleared)
                self.blocks.clear()

    @rule(t=tokens)
    def insert(self, t: list[int]) -> None:
        if self.alloc.num_free < len(t):
            self.cache.evict(len(t))
        slots = self.alloc.alloc(len(t))
        if slots is None:
            return
        n = self.cache.insert(t, slots).cached_len
        self.alloc.free(slots[:n])

    @rule(t=tokens)
    def lock(self, t: list[int]) -> None:
        m = self.cache.match_prefix(t)
        if m.length:
            self.cache.inc_lock_ref(m.last_node)
            self.locked.append(m.last_node)

    @rule()
    def unlock(self) -> None:
        if self.locked:
            self.cache.dec_lock_ref(self.locked.pop())

    @rule(n=st.integers(1, 20))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule()
    def flush(self) -> None:
        self.cache.flush_unlocked()

    @invariant()
    def mirror_equals_tree(self) -> None:
        self._sync()
        assert self.mirror.paths() == {tuple(p) for p in self.cache.leaf_paths()}
        assert self.mirror.size == self.cache.total_size() + self.cache.tier_size()
        assert self.blocks == expected_blocks(self.cache)


TestMirror = MirrorMachine.TestCase
TestMirror.settings = settings(
    max_examples=50, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_match_counts_tokens_inside_nodes() -> None:
    tree = TokenTree.from_paths([[1, 2, 3, 4], [1, 2, 9]])
    assert tree.match([1, 2, 3, 7]) == 3
    assert tree.match([1, 2, 9, 9]) == 3
    assert tree.match([5]) == 0
    assert tree.size == 5


def test_remove_cuts_the_subtree_below() -> None:
    tree = TokenTree.from_paths([[1, 2, 3, 4], [1, 2, 3, 5, 6]])
    assert tree.remove([1, 2, 3, 4], 2) == 4  # from token 3 on, both branches go
    assert tree.paths() == {(1, 2)}
    assert tree.remove([7, 8], 1) == 0  # not held: nothing happens


def test_evict_to_drops_least_recent_leaves() -> None:
    tree = TokenTree()
    tree.insert([1, 1, 1])
    tree.insert([2, 2, 2])
    tree.match([1, 1, 1])  # touch the first
    tree.evict_to(3)
    assert tree.paths() == {(1, 1, 1)}


def test_block_view_removes_every_block_below_a_cut() -> None:
    view = BlockView(BLOCK)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 0, 0, 0, 0, 0]
    live: set[int] = set()
    for path in (a, b):
        stored = view.stored(path, view.tree.match(path))
        live |= set(stored.block_hashes) if stored else set()
    assert live == set(vllm_chain(a, BLOCK)) | set(vllm_chain(b, BLOCK))
    removed = view.removed(a[:5], 2)  # tokens 3.. of the shared path, and both branches below them
    assert removed is not None
    live -= set(removed.block_hashes)
    assert live == set() and view.tree.paths() == {(1, 2, 3)}


class TieredMirrorMachine(MirrorMachine):
    """The same with a second KV tier under the tree: evictions move K/V to the tier (`PrefixMoved`), the
    tier's own drops remove paths; the mirror still equals the tree, tier nodes included."""

    def __init__(self) -> None:
        super().__init__()
        pool = KVPool(KVLayout((LayerKV(1, 2, 2),)), 96, torch.float32)
        self.cache = RadixCache(self.alloc, self.rec, KVTier(pool, 20, "float32"))

    @rule(t=tokens)
    def load(self, t: list[int]) -> None:
        self.cache.match_prefix(t, load=True)


TestTieredMirror = TieredMirrorMachine.TestCase
TestTieredMirror.settings = settings(
    max_examples=50, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
