"""A request's KV slots, between the scheduler and the prefix cache: match, allocate, cache, release.

The scheduler asks this one object for everything about KV memory: a table row and the cached prefix when a
request is admitted, fresh slots for the tokens it computes, caching of what it computed at the end of each
prefill chunk and when it leaves (finished, aborted or retracted), and how much memory could be had. The
`RadixCacheManager` shares prefixes through the radix tree (and tells an optional `CacheEventSink` what it
stores and evicts); the `NullCacheManager`, used when prefix caching is off, shares nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from vriksha.engine.core.cache_events import AdapterEvents, CacheEventSink
from vriksha.engine.core.kv_pool import ReqToTokenTable, SlotAllocator
from vriksha.engine.core.kv_tier import KVTier, TierCounters
from vriksha.engine.core.prompt_logprobs import wants_prompt_logprobs
from vriksha.engine.core.radix_cache import RadixCache, TreeNode
from vriksha.engine.core.request import Request
from vriksha.engine.core.sessions import Pin, SessionCounters, SessionTable
from vriksha.profiling import phase

# (first uncached position, tokens) of each prompt computed this step
InFlight = Sequence[tuple[int, list[int]]]


class CacheManager(ABC):
    def __init__(self, allocator: SlotAllocator, table: ReqToTokenTable) -> None:
        self.allocator = allocator
        self.table = table

    @abstractmethod
    def set_event_sink(self, events: CacheEventSink | None) -> None:
        """Tell `events` of every run of tokens cached, evicted or flushed from now on (None: stop)."""

    # ---- memory ------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def available(self) -> int:
        """Slots that could be had now: free ones plus those unlocked cache entries hold."""
        return self.allocator.num_free + self.evictable_size()

    def alloc_slots(self, n: int) -> torch.Tensor | None:
        """`n` free slots for the caller to own (a K/V transfer), evicting cache if need be; None when short."""
        return self._alloc(n)

    def _alloc(self, n: int) -> torch.Tensor | None:
        if n > self.allocator.num_free:
            with phase("engine.cache_evict"):
                self.evict(n - self.allocator.num_free)
        return self.allocator.alloc(n)

    # ---- a request ---------------------------------------------------------------------------------
    def admit(self, req: Request) -> bool:
        """Give a waiting request a table row and its cached prefix (at least one token is left to compute).
        False, changing nothing, when no row is free."""
        row = self.table.alloc_row()
        if row is None:
            return False
        req.row = row
        tokens = req.all_token_ids
        # keep >= 1 token to compute; a request scoring its prompt (prompt_logprobs) computes all of it
        slots, node = self._match(tokens[: 0 if wants_prompt_logprobs(req) else len(tokens) - 1], req.lora_id)
        self.table.write(row, 0, slots)
        req.num_computed = req.cached_len = slots.numel()
        self._lock(req, node)
        return True

    def allocate(self, req: Request, n: int) -> bool:
        """Slots for the request's next `n` tokens (from position num_computed), evicting cache if need be."""
        slots = self._alloc(n)
        if slots is None:
            return False
        self.table.write(req.row, req.num_computed, slots)
        return True

    def allocate_decodes(self, reqs: Sequence[Request]) -> bool:
        """One slot each for the next token of every request (no eviction: the caller made room)."""
        slots = self.allocator.alloc(len(reqs))
        if slots is None:
            return False
        self.table.write_each([r.row for r in reqs], [r.num_computed for r in reqs], slots)
        return True

    def allocate_draft(self, req: Request, n: int) -> bool:
        """Slots for `n` speculative tokens after the request's next one (positions num_computed + 1 on), from
        free slots only: a proposal never evicts the cache."""
        slots = self.allocator.alloc(n)
        if slots is None:
            return False
        self.table.write(req.row, req.num_computed + 1, slots)
        return True

    def free_positions(self, req: Request, start: int, end: int) -> None:
        """Give back the slots of the request's positions [start, end): speculative tokens not kept. They lie
        past its cached prefix, so the request alone holds them."""
        if end > start:
            assert start >= req.cached_len, "cached positions belong to the radix tree"
            self.allocator.free(self.table.read(req.row, end)[start:].clone())

    # ---- sessions ----------------------------------------------------------------------------------
    def open_session(self, session_id: str) -> None:
        """A request of `session_id` arrived (opens the session, or marks it used)."""
        return None

    def close_session(self, session_id: str) -> bool:
        """Close the session, releasing its pinned prefix; False when it is not open."""
        return False

    def expire_sessions(self) -> None:
        """Close the sessions idle past their timeout."""
        return None

    def pinned_tokens(self) -> int:
        return 0

    def release_pins_for(self, num_tokens: int) -> bool:
        """Release session pins until `num_tokens` slots could be had; False when that is not enough."""
        return self.available() >= num_tokens

    def session_counts(self) -> tuple[int, int, SessionCounters]:
        """(open sessions, sessions holding a pin, counters)."""
        return 0, 0, SessionCounters()

    def tier_counts(self) -> tuple[int, int, TierCounters]:
        """The second KV tier's (capacity, tokens held, counters); zeros when there is none."""
        return 0, 0, TierCounters()

    def release(self, req: Request) -> None:
        """The request leaves the running set: its computed KV is cached (or freed) and its row returned."""
        if req.row is not None:
            self.cache_req(req, finished=True)

    @abstractmethod
    def cache_req(self, req: Request, *, finished: bool) -> None:
        """Cache the request's computed tokens: at the end of a prefill chunk (`finished=False`, the request
        keeps running on the cached copy) or when it leaves (`finished=True`: unlock, free its row)."""

    def _free_row(self, req: Request) -> None:
        self.table.free_row(req.row)
        req.row = None
        req.cached_len = 0

    # ---- the prefix cache --------------------------------------------------------------------------
    @abstractmethod
    def _match(self, token_ids: list[int], lora_id: int = 0) -> tuple[torch.Tensor, TreeNode | None]: ...

    @abstractmethod
    def _lock(self, req: Request, node: TreeNode | None) -> None: ...

    @abstractmethod
    def match_len(self, token_ids: list[int], lora_id: int = 0) -> int:
        """How many leading tokens are cached (for the LoRA adapter `lora_id`, 0: the base model)."""

    @abstractmethod
    def prefix_in_flight(
        self, token_ids: list[int], in_flight: InFlight, min_len: int, lora_id: int = 0
    ) -> bool:
        """Whether a prompt computed this step also computes the next `min_len` uncached tokens of
        `token_ids`, so that waiting one step reads them from the cache instead of computing them again."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def total_size(self) -> int: ...

    @abstractmethod
    def slot_set(self) -> set[int]: ...

    @abstractmethod
    def flush(self) -> bool:
        """Drop every unlocked entry; False when running requests still hold some."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every entry; refuses (RadixCacheError) while requests hold some."""


class RadixCacheManager(CacheManager):
    """Prefixes shared through radix trees: one per LoRA adapter (key 0: the base model), so that K/V computed
    with one adapter is never matched by a request of another. Every tree draws on the one slot allocator.
    An adapter tree's cache events carry the adapter's name (`AdapterEvents`), so a mirror keys them apart."""

    def __init__(
        self,
        allocator: SlotAllocator,
        table: ReqToTokenTable,
        events: CacheEventSink | None = None,
        session_capacity: int | None = None,
        session_timeout_s: float = 300.0,
        tier: KVTier | None = None,
    ) -> None:
        """`session_capacity`: most tokens open sessions may pin together (default: half the pool).
        `tier`: a second KV tier that evicted prefixes move to (None: they are dropped)."""
        super().__init__(allocator, table)
        self.tier = tier
        self.trees: dict[int, RadixCache] = {0: RadixCache(allocator, events, tier)}
        self.events = events
        self.adapter_names: dict[int, str] = {}  # the name of each adapter id (events, snapshots)
        capacity = allocator.capacity // 2 if session_capacity is None else session_capacity
        self.sessions = SessionTable(capacity, session_timeout_s, self._unpin)

    @property
    def tree(self) -> RadixCache:
        """The base model's tree."""
        return self.trees[0]

    def _tree(self, lora_id: int) -> RadixCache:
        tree = self.trees.get(lora_id)
        if tree is None:
            tree = self.trees[lora_id] = RadixCache(self.allocator, self._adapter_events(lora_id), self.tier)
        return tree

    def _adapter_events(self, lora_id: int) -> CacheEventSink | None:
        if self.events is None:
            return None
        return AdapterEvents(self.events, self.adapter_names.get(lora_id, f"lora-{lora_id}"))

    def name_adapter(self, lora_id: int, name: str) -> None:
        self.adapter_names[lora_id] = name

    def drop_adapter(self, lora_id: int) -> None:
        """An adapter version left the engine: free its tree (no request holds it any more), telling the
        event sink which paths left."""
        self.sessions.release_all(lora_id)
        tree = self.trees.pop(lora_id, None)
        if tree is not None:
            tree.flush_unlocked()
        self.adapter_names.pop(lora_id, None)

    def adapter_leaf_paths(self) -> dict[str, list[list[int]]]:
        """Each adapter tree's leaf paths, by adapter name (a KV-events snapshot)."""
        out: dict[str, list[list[int]]] = {}
        for lora_id, tree in self.trees.items():
            if lora_id:
                out.setdefault(self.adapter_names.get(lora_id, f"lora-{lora_id}"), []).extend(
                    tree.leaf_paths()
                )
        return out

    def set_event_sink(self, events: CacheEventSink | None) -> None:
        self.events = events
        for lora_id, tree in self.trees.items():
            tree.events = events if lora_id == 0 else self._adapter_events(lora_id)

    def _match(self, token_ids: list[int], lora_id: int = 0) -> tuple[torch.Tensor, TreeNode | None]:
        with phase("engine.cache_match"):
            match = self._tree(lora_id).match_prefix(token_ids, load=self.tier is not None)
        return match.slots, match.last_node

    def _lock(self, req: Request, node: TreeNode | None) -> None:
        tree = self._tree(req.lora_id)
        if node is not None:
            tree.inc_lock_ref(node)
        if req.cache_node is not None:
            tree.dec_lock_ref(req.cache_node)
        req.cache_node = node

    def match_len(self, token_ids: list[int], lora_id: int = 0) -> int:
        with phase("engine.cache_match"):
            return self._tree(lora_id).match_prefix(token_ids).length

    def prefix_in_flight(
        self, token_ids: list[int], in_flight: InFlight, min_len: int, lora_id: int = 0
    ) -> bool:
        if not in_flight:
            return False
        cached = self.match_len(token_ids[:-1], lora_id)
        end = cached + min_len
        tokens = token_ids[:end]
        if len(tokens) < end:
            return False
        return any(start <= cached and other[cached:end] == tokens[cached:] for start, other in in_flight)

    def cache_req(self, req: Request, *, finished: bool) -> None:
        n = req.num_computed
        if finished or n > req.cached_len:
            with phase("engine.cache_insert"):
                slots = self.table.read(req.row, n).clone()
                result = self._tree(req.lora_id).insert(req.all_token_ids[:n], slots)
                if result.cached_len > req.cached_len:  # cached meanwhile by another request: use those
                    self.allocator.free(slots[req.cached_len : result.cached_len])
                    if not finished:
                        self.table.write(req.row, req.cached_len, result.cached_slots[req.cached_len :])
            if not finished:
                req.cached_len = n
                self._lock(req, result.node)
        if finished:
            if req.session_id is not None and req.finish_reason is not None and n > 0:
                self._pin(req, result.node, n)
            self._lock(req, None)
            self._free_row(req)

    # ---- sessions ----------------------------------------------------------------------------------
    def open_session(self, session_id: str) -> None:
        self.sessions.touch(session_id)

    def close_session(self, session_id: str) -> bool:
        return self.sessions.close(session_id)

    def expire_sessions(self) -> None:
        self.sessions.expire()

    def pinned_tokens(self) -> int:
        return self.sessions.pinned_tokens

    def session_counts(self) -> tuple[int, int, SessionCounters]:
        return self.sessions.num_open, self.sessions.num_pinned, self.sessions.counters

    def tier_counts(self) -> tuple[int, int, TierCounters]:
        if self.tier is None:
            return super().tier_counts()
        return self.tier.capacity, self.tier.used, self.tier.counters

    def _pin(self, req: Request, node: TreeNode, tokens: int) -> None:
        """Pin the finished request's cached tokens for its session (until its next turn finishes)."""
        assert req.session_id is not None
        tree = self._tree(req.lora_id)
        tree.inc_lock_ref(node)
        if not self.sessions.pin(req.session_id, Pin(req.lora_id, node, tokens)):
            tree.dec_lock_ref(node)

    def _unpin(self, pin: Pin) -> None:
        tree = self.trees.get(pin.lora_id)
        if tree is not None:
            tree.dec_lock_ref(pin.node)

    def release_pins_for(self, num_tokens: int) -> bool:
        """Release the youngest sessions' pins until `num_tokens` slots could be had (nothing else would free
        them: no request is running); False when all pins went and it is still not enough."""
        while self.available() < num_tokens:
            if not self.sessions.release_youngest():
                return False
        return True

    def evict(self, num_tokens: int) -> int:
        """Unpinned entries first; only when they are not enough, the youngest sessions' pins are released."""
        self.sessions.expire()
        freed = self._evict_unpinned(num_tokens)
        while freed < num_tokens and self.sessions.release_youngest():
            freed += self._evict_unpinned(num_tokens - freed)
        return freed

    def _evict_unpinned(self, num_tokens: int) -> int:
        """Least recently used first within a tree; the adapters' trees, least recently matched first, give
        up theirs before the base model's."""
        freed = 0
        order = sorted(self.trees.items(), key=lambda kv: (kv[0] == 0, kv[1].root.last_access))
        for _, tree in order:
            if freed >= num_tokens:
                break
            freed += tree.evict(num_tokens - freed)
        return freed

    def evictable_size(self) -> int:
        return sum(t.evictable_size() for t in self.trees.values())

    def total_size(self) -> int:
        return sum(t.total_size() for t in self.trees.values())

    def slot_set(self) -> set[int]:
        return set().union(*(t.slot_set() for t in self.trees.values()))

    def flush(self) -> bool:
        for tree in self.trees.values():
            tree.flush_unlocked()
        return self.total_size() == 0

    def reset(self) -> None:
        """Drop every entry (the sessions stay open but their pins go: their K/V is stale)."""
        self.sessions.release_all()
        for tree in self.trees.values():
            tree.reset()


class NullCacheManager(CacheManager):
    """Prefix caching off: nothing is shared, a request's slots are its own until it leaves."""

    def set_event_sink(self, events: CacheEventSink | None) -> None:
        pass  # nothing is ever cached

    def _match(self, token_ids: list[int], lora_id: int = 0) -> tuple[torch.Tensor, TreeNode | None]:
        return torch.empty(0, dtype=torch.int64, device=self.allocator.device), None

    def _lock(self, req: Request, node: TreeNode | None) -> None:
        pass

    def match_len(self, token_ids: list[int], lora_id: int = 0) -> int:
        return 0

    def prefix_in_flight(
        self, token_ids: list[int], in_flight: InFlight, min_len: int, lora_id: int = 0
    ) -> bool:
        return False  # nothing computed now is read back later

    def cache_req(self, req: Request, *, finished: bool) -> None:
        if finished:
            self.allocator.free(self.table.read(req.row, req.num_computed).clone())
            self._free_row(req)

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def slot_set(self) -> set[int]:
        return set()

    def flush(self) -> bool:
        return True

    def reset(self) -> None:
        pass

    def drop_adapter(self, lora_id: int) -> None:
        pass

    def name_adapter(self, lora_id: int, name: str) -> None:
        pass


def make_cache_manager(
    enable_prefix_caching: bool,
    allocator: SlotAllocator,
    table: ReqToTokenTable,
    events: CacheEventSink | None = None,
    session_capacity: int | None = None,
    session_timeout_s: float = 300.0,
    tier: KVTier | None = None,
) -> CacheManager:
    if enable_prefix_caching:
        return RadixCacheManager(allocator, table, events, session_capacity, session_timeout_s, tier)
    return NullCacheManager(allocator, table)
