"""The cache manager: a request's KV slots between the scheduler and the radix tree (or the null cache)."""

from __future__ import annotations

import torch

from vriksha.engine.core.cache_manager import NullCacheManager, RadixCacheManager, make_cache_manager
from vriksha.engine.core.kv_pool import ReqToTokenTable, SlotAllocator
from vriksha.engine.core.request import Request
from vriksha.engine.core.sampling_params import SamplingParams

NUM_SLOTS = 64


def request(tokens: list[int]) -> Request:
    return Request("r", 0, list(tokens), SamplingParams(max_tokens=4), frozenset())


def manager(cls, events=None):
    alloc = SlotAllocator(NUM_SLOTS)
    table = ReqToTokenTable(4, 32)
    return cls(alloc, table) if events is None else cls(alloc, table, events)


def run_prefill(cm, req: Request) -> None:
    """Admit `req` and compute its whole prompt in one chunk, as the scheduler and the step would."""
    assert cm.admit(req)
    assert cm.allocate(req, req.uncomputed)
    req.num_computed = req.num_tokens
    cm.cache_req(req, finished=False)


def owned(cm) -> set[int]:
    return cm.slot_set() | cm.allocator.free_slot_set()


def test_null_cache_stores_nothing_and_frees_a_request_when_it_leaves():
    cm = manager(NullCacheManager)
    req = request([1, 2, 3])
    run_prefill(cm, req)
    assert req.cached_len == 0 and req.cache_node is None
    assert cm.allocator.num_free == cm.allocator.capacity - 3  # nothing freed at the chunk's end
    assert cm.match_len([1, 2, 3]) == 0
    assert cm.total_size() == 0 and cm.slot_set() == set() and cm.evict(10) == 0
    assert not cm.prefix_in_flight([1, 2, 3, 4], [(0, [1, 2, 3, 4])], 1)
    cm.release(req)
    assert req.row is None and cm.allocator.num_free == cm.allocator.capacity
    assert cm.flush() and isinstance(make_cache_manager(False, cm.allocator, cm.table), NullCacheManager)


def test_chunk_end_caches_and_locks_then_release_unlocks_and_keeps_the_tokens():
    cm = manager(RadixCacheManager)
    req = request([1, 2, 3, 4])
    run_prefill(cm, req)
    assert req.cached_len == 4 and req.cache_node.token_path() == [1, 2, 3, 4]
    assert cm.tree.protected_size() == 4 and cm.evictable_size() == 0
    slots = cm.table.read(req.row, 4).tolist()
    assert cm.tree.match_prefix([1, 2, 3, 4]).slots.tolist() == slots
    cm.release(req)
    assert req.row is None and req.cache_node is None
    assert cm.tree.protected_size() == 0 and cm.evictable_size() == 4
    assert owned(cm) == set(range(1, NUM_SLOTS))
    assert cm.flush() and cm.allocator.num_free == cm.allocator.capacity


def test_tokens_cached_meanwhile_by_another_request_replace_the_duplicates():
    cm = manager(RadixCacheManager)
    a, b = request([7, 8, 9, 1]), request([7, 8, 9, 2])
    assert cm.admit(a) and cm.admit(b)  # both admitted before either cached anything
    assert cm.allocate(a, 4) and cm.allocate(b, 4)
    a.num_computed = b.num_computed = 4
    cm.cache_req(a, finished=False)
    b_before = cm.table.read(b.row, 4).tolist()
    free_before = cm.allocator.num_free
    cm.cache_req(b, finished=False)
    a_slots, b_slots = cm.table.read(a.row, 4).tolist(), cm.table.read(b.row, 4).tolist()
    assert b_slots[:3] == a_slots[:3] and b_slots[3] == b_before[3]
    assert cm.allocator.num_free == free_before + 3  # b's copies of [7, 8, 9] went back to the pool
    assert b.cached_len == 4 and b.cache_node.token_path() == [7, 8, 9, 2]
    cm.release(a)
    cm.release(b)
    assert owned(cm) == set(range(1, NUM_SLOTS)) and cm.total_size() == 5


def test_admit_reuses_the_cached_prefix_but_leaves_one_token_to_compute():
    cm = manager(RadixCacheManager)
    first = request([5, 6, 7])
    run_prefill(cm, first)
    cm.release(first)
    again = request([5, 6, 7])
    assert cm.admit(again)
    assert again.num_computed == again.cached_len == 2 and again.uncomputed == 1
    assert cm.match_len([5, 6, 7, 8]) == 3
    assert cm.prefix_in_flight([5, 6, 7, 1, 2, 3], [(3, [5, 6, 7, 1, 2, 3, 4])], 3)
    assert not cm.prefix_in_flight([5, 6, 7, 1, 2, 3], [(3, [5, 6, 7, 9, 9, 9, 9])], 3)
    cm.release(again)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def stored(self, parent, token_ids, slots) -> None:
        self.events.append(("stored", list(parent), list(token_ids), slots.numel()))

    def removed(self, parent, token_ids) -> None:
        self.events.append(("removed", list(parent), list(token_ids)))

    def cleared(self) -> None:
        self.events.append(("cleared",))


def test_events_report_inserts_evictions_flushes_and_resets():
    sink = Recorder()
    cm = manager(RadixCacheManager, events=sink)
    for tokens in ([1, 2, 3], [1, 2, 4]):
        req = request(tokens)
        run_prefill(cm, req)
        cm.release(req)
    assert sink.events == [("stored", [], [1, 2, 3], 3), ("stored", [1, 2], [4], 1)]
    assert cm.evict(1) == 1
    assert sink.events[-1] == ("removed", [1, 2], [3])
    cm.flush()
    assert sink.events[-1] == ("removed", [], [1, 2]) and cm.total_size() == 0
    run_prefill(cm, req := request([9, 9]))
    cm.release(req)
    cm.reset()
    assert sink.events[-2:] == [("stored", [], [9, 9], 2), ("cleared",)]
    assert cm.allocator.num_free == cm.allocator.capacity
    cm.set_event_sink(None)
    run_prefill(cm, req := request([4, 4]))
    cm.release(req)
    assert sink.events[-1] == ("cleared",)  # unsubscribed: nothing more
    late = Recorder()
    cm.set_event_sink(late)
    cm.flush()
    assert late.events == [("removed", [], [4, 4])]


def test_decode_slots_land_at_each_requests_next_position():
    cm = manager(RadixCacheManager)
    reqs = [request([1, 2]), request([3, 4, 5])]
    for r in reqs:
        run_prefill(cm, r)
    assert cm.allocate_decodes(reqs)
    for r in reqs:
        slot = int(cm.table.table[r.row, r.num_computed])
        assert slot != 0 and slot not in cm.allocator.free_slot_set() and slot not in cm.slot_set()
    assert torch.unique(cm.table.table[[r.row for r in reqs], [r.num_computed for r in reqs]]).numel() == 2
