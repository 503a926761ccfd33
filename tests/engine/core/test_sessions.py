"""Sessions in the cache manager: a session's latest prefix stays pinned against eviction until its next turn,
its close, its timeout or the pinned share's limit; the slot ownership invariant holds throughout."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from vriksha.engine.core.cache_manager import RadixCacheManager
from vriksha.engine.core.kv_pool import ReqToTokenTable, SlotAllocator
from vriksha.engine.core.request import Request
from vriksha.engine.core.sampling_params import SamplingParams

NUM_SLOTS = 64


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def manager(capacity: int = 32, timeout_s: float = 10.0, clock: Clock | None = None) -> RadixCacheManager:
    cm = RadixCacheManager(SlotAllocator(NUM_SLOTS), ReqToTokenTable(4, 64), None, capacity, timeout_s)
    if clock is not None:
        cm.sessions.clock = clock
    return cm


def turn(cm: RadixCacheManager, tokens: list[int], session: str | None) -> Request:
    """One request run to its end as the scheduler would: admit, compute every token, finish."""
    req = Request("r", 0, list(tokens), SamplingParams(max_tokens=1), frozenset(), session_id=session)
    if session is not None:
        cm.open_session(session)
    assert cm.admit(req)
    assert cm.allocate(req, req.uncomputed)
    req.num_computed = req.num_tokens
    cm.cache_req(req, finished=False)
    req.finish_reason = "stop"
    cm.release(req)
    return req


def pinned_paths(cm: RadixCacheManager) -> list[list[int]]:
    return [s.pin.node.token_path() for s in cm.sessions.sessions.values() if s.pin is not None]


def test_a_session_prefix_survives_eviction_that_takes_every_other_entry():
    cm = manager()
    turn(cm, [1, 2, 3, 4, 5], "a")
    turn(cm, [9, 8, 7], None)
    assert cm.pinned_tokens() == 5 and cm.evictable_size() == 3
    assert cm.evict(3) == 3  # the unpinned entry goes, the pin stays
    assert cm.match_len([1, 2, 3, 4, 5, 6]) == 5 and cm.match_len([9, 8, 7]) == 0


def test_the_next_turn_moves_the_pin_and_close_releases_it():
    cm = manager()
    turn(cm, [1, 2, 3], "a")
    turn(cm, [1, 2, 3, 4, 5, 6], "a")
    assert pinned_paths(cm) == [[1, 2, 3, 4, 5, 6]] and cm.pinned_tokens() == 6
    assert cm.close_session("a") and not cm.close_session("a")
    assert cm.pinned_tokens() == 0 and cm.tree.protected_size() == 0 and cm.evictable_size() == 6


def test_an_idle_session_times_out_and_its_pin_is_released():
    clock = Clock()
    cm = manager(timeout_s=10.0, clock=clock)
    turn(cm, [1, 2, 3], "a")
    clock.now = 5.0
    turn(cm, [4, 5], "b")
    clock.now = 12.0  # a idle for 12 s, b for 7 s
    cm.expire_sessions()
    assert pinned_paths(cm) == [[4, 5]] and cm.sessions.counters.timed_out == 1
    assert cm.tree.protected_size() == 2


def test_past_the_share_the_youngest_session_gives_way():
    cm = manager(capacity=8)
    turn(cm, [1, 2, 3], "a")
    turn(cm, [4, 5, 6], "b")
    turn(cm, [7, 8, 9], "c")  # 9 > 8 and c is the youngest: not pinned
    assert pinned_paths(cm) == [[1, 2, 3], [4, 5, 6]] and cm.pinned_tokens() == 6
    turn(cm, [1, 2, 3, 10, 11, 12], "a")  # a grows to 6: 3 + 6 > 8, b (younger) gives way
    assert pinned_paths(cm) == [[1, 2, 3, 10, 11, 12]] and cm.sessions.counters.released_over_share == 1
    turn(cm, list(range(20, 30)), "d")  # larger than the share alone: not pinned, a kept
    assert pinned_paths(cm) == [[1, 2, 3, 10, 11, 12]]
    assert cm.close_session("a")
    turn(cm, [7, 8, 9], "c")  # a's share is free again
    assert pinned_paths(cm) == [[7, 8, 9]]


def test_memory_needed_by_a_running_request_releases_the_youngest_pins_first():
    cm = manager(capacity=63)
    turn(cm, list(range(100, 130)), "a")
    turn(cm, list(range(200, 230)), "b")
    assert cm.allocator.num_free == 3 and cm.available() == 3  # admission does not count on pins
    req = Request("r", 0, list(range(300, 320)), SamplingParams(max_tokens=1), frozenset())
    assert cm.admit(req) and cm.allocate(req, 20)
    assert pinned_paths(cm) == [list(range(100, 130))]  # b's pin (the youngest) went, a's stays
    assert cm.sessions.counters.released_for_memory == 1


def test_a_retracted_request_pins_nothing_and_reset_releases_every_pin():
    cm = manager()
    req = Request("r", 0, [1, 2, 3], SamplingParams(max_tokens=1), frozenset(), session_id="a")
    cm.open_session("a")
    assert cm.admit(req) and cm.allocate(req, 3)
    req.num_computed = 3
    cm.release(req)  # no finish_reason: retracted, to come back
    assert cm.pinned_tokens() == 0
    turn(cm, [1, 2, 3], "a")
    assert cm.pinned_tokens() == 3
    cm.reset()
    assert cm.pinned_tokens() == 0 and cm.total_size() == 0 and cm.sessions.num_open == 1


class SessionMachine(RuleBasedStateMachine):
    """Turns of a few sessions and of no session, closes, timeouts and evictions against the invariants: every
    slot is owned by the free list or the tree, a pinned path is cached, the pin books add up."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.cm = manager(capacity=24, timeout_s=5.0, clock=self.clock)
        self.history: dict[str, list[int]] = {}

    @rule(
        session=st.sampled_from(["a", "b", "c", None]),
        more=st.lists(st.integers(0, 3), min_size=1, max_size=9),
    )
    def run_turn(self, session, more):
        tokens = (self.history.get(session, []) if session else []) + more
        if len(tokens) > 40:
            tokens = more
        if not self.cm.release_pins_for(len(tokens)):
            return
        turn(self.cm, tokens, session)
        if session:
            self.history[session] = tokens

    @rule(session=st.sampled_from(["a", "b", "c"]))
    def close(self, session):
        had = session in self.cm.sessions.sessions
        assert self.cm.close_session(session) == had
        assert session not in self.cm.sessions.sessions

    @rule(dt=st.floats(0.0, 4.0))
    def wait(self, dt):
        self.clock.now += dt
        self.cm.expire_sessions()
        for s in self.cm.sessions.sessions.values():
            assert self.clock.now - s.last_use <= 5.0

    @rule(k=st.integers(1, 40))
    def evict(self, k):
        pinned = pinned_paths(self.cm)
        evictable = self.cm.evictable_size()
        freed = self.cm.evict(k)
        if freed <= evictable:  # unpinned entries sufficed: every pin stays
            assert pinned_paths(self.cm) == pinned

    @invariant()
    def slots_partitioned(self):
        free = self.cm.allocator.free_slot_set()
        tree = self.cm.slot_set()
        assert not (free & tree) and free | tree == set(range(1, NUM_SLOTS))

    @invariant()
    def pins_are_cached_and_counted(self):
        pins = [s.pin for s in self.cm.sessions.sessions.values() if s.pin is not None]
        assert self.cm.pinned_tokens() == sum(p.tokens for p in pins) <= 24
        for p in pins:
            path = p.node.token_path()
            assert len(path) == p.tokens and self.cm.match_len(path) == p.tokens
        # nothing runs between turns: every locked token is a pinned one
        assert self.cm.tree.protected_size() == len({t for p in pins for t in _prefixes(p.node.token_path())})


def _prefixes(path: list[int]) -> list[tuple[int, ...]]:
    return [tuple(path[: i + 1]) for i in range(len(path))]


SessionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestSessionMachine = SessionMachine.TestCase
