"""Continuous batching: which requests run this step, and the KV memory they need.

Every step carries all running decodes plus prefill chunks within the token budget (prefill-first for the
waiting queue, chunked for long prompts). The waiting queue is ordered by longest cached prefix (FCFS past
`lpm_max_queue`). A prompt that shares a long uncached prefix with one admitted in the same step waits one
step so that it reads that prefix from the cache instead of computing it again. When KV memory runs out the
cache is evicted first, then the newest running requests are retracted (their KV goes to the cache, and
they recompute what was evicted when they return).
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from vriksha.engine.config import EngineConfig
from vriksha.engine.kv_pool import ReqToTokenTable, SlotAllocator
from vriksha.engine.model_runner import ForwardBatch, PrefillChunk
from vriksha.engine.radix_cache import RadixCache
from vriksha.engine.request import Request, Status
from vriksha.profiling import phase

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self, config: EngineConfig, allocator: SlotAllocator, table: ReqToTokenTable, cache: RadixCache
    ) -> None:
        self.config = config
        self.allocator = allocator
        self.table = table
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_retracted = 0

    # ---- queue -------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- KV bookkeeping ----------------------------------------------------------------------------
    def _alloc(self, n: int) -> torch.Tensor | None:
        if n > self.allocator.num_free:
            with phase("engine.cache_evict"):
                self.cache.evict(n - self.allocator.num_free)
        return self.allocator.alloc(n)

    def _lock(self, req: Request, node) -> None:
        if req.cache_node is not None:
            self.cache.dec_lock_ref(req.cache_node)
        req.cache_node = node
        self.cache.inc_lock_ref(node)

    def cache_computed(self, req: Request) -> None:
        """Put the request's computed tokens into the tree (after a prefill chunk) and re-point at its slots."""
        if not self.cache.enabled or req.num_computed <= req.cached_len:
            return
        with phase("engine.cache_insert"):
            tokens = req.all_token_ids[: req.num_computed]
            slots = self.table.read(req.row, req.num_computed).clone()
            already = self.cache.insert(tokens, slots)
            if already > req.cached_len:  # someone else cached these meanwhile: use theirs, free ours
                self.allocator.free(slots[req.cached_len : already])
            match = self.cache.match_prefix(tokens)
            self.table.write(req.row, 0, match.slots)
            req.cached_len = match.length
            self._lock(req, match.last_node)

    def release(self, req: Request) -> None:
        """The request leaves the running set: its KV goes to the tree (or back to the pool)."""
        if req.row is None:
            return
        slots = self.table.read(req.row, req.num_computed).clone()
        if self.cache.enabled:
            with phase("engine.cache_insert"):
                tokens = req.all_token_ids[: req.num_computed]
                already = self.cache.insert(tokens, slots)
                if already > req.cached_len:
                    self.allocator.free(slots[req.cached_len : already])
        else:
            self.allocator.free(slots[req.cached_len :])
        if req.cache_node is not None:
            self.cache.dec_lock_ref(req.cache_node)
            req.cache_node = None
        self.table.free_row(req.row)
        req.row = None
        req.cached_len = 0

    def finish(self, req: Request) -> None:
        self.release(req)
        req.status = Status.FINISHED
        if req in self.running:
            self.running.remove(req)

    def abort(self, req: Request) -> None:
        if req.status is Status.WAITING:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
            req.status = Status.FINISHED
            return
        self.finish(req)

    def _retract(self, req: Request) -> None:
        self.release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.num_retracted += 1
        logger.info("KV memory short: retracted %s/%d (%d tokens)", req.request_id, req.index, req.num_tokens)

    # ---- admission ---------------------------------------------------------------------------------
    def _admit(self, req: Request) -> bool:
        """Give a waiting request a table row and its cached prefix. False when no row is free."""
        row = self.table.alloc_row()
        if row is None:
            return False
        req.row = row
        tokens = req.all_token_ids
        with phase("engine.cache_match"):
            match = self.cache.match_prefix(tokens[: len(tokens) - 1])  # keep >= 1 token to compute
        self.table.write(row, 0, match.slots)
        req.num_computed = req.cached_len = match.length
        self._lock(req, match.last_node)
        if not req.admitted_once:
            req.num_cached_prompt_tokens = min(match.length, len(req.prompt_token_ids))
            req.admitted_once = True
        req.status = Status.RUNNING
        return True

    def _order_waiting(self) -> list[Request]:
        if not self.cache.enabled or len(self.waiting) > self.config.lpm_max_queue or len(self.waiting) < 2:
            return list(self.waiting)
        with phase("engine.cache_match"):
            matched = {id(r): self.cache.match_prefix(r.all_token_ids[:-1]).length for r in self.waiting}
        return sorted(self.waiting, key=lambda r: -matched[id(r)])

    # ---- one step ----------------------------------------------------------------------------------
    def schedule(self) -> ForwardBatch:
        with phase("engine.schedule"):
            decodes = self._schedule_decodes()
            budget = self.config.max_num_batched_tokens - len(decodes)
            prefills = self._schedule_prefills(budget, reserve=len(decodes))
            return ForwardBatch(decodes=decodes, prefills=prefills)

    def _schedule_decodes(self) -> list[Request]:
        decodes = [r for r in self.running if r.uncomputed == 1]
        need = len(decodes)
        if need and self.allocator.num_free < need:
            self.cache.evict(need - self.allocator.num_free)
        while decodes and self.allocator.num_free < len(decodes):
            victim = max(self.running, key=lambda r: r.arrival_time)
            if victim in decodes:
                decodes.remove(victim)
            self._retract(victim)
        if decodes:
            slots = self.allocator.alloc(len(decodes))
            for req, slot in zip(decodes, slots.tolist(), strict=True):
                self.table.table[req.row, req.num_computed] = slot
        return decodes

    def _schedule_prefills(self, budget: int, reserve: int) -> list[PrefillChunk]:
        chunks: list[PrefillChunk] = []
        # (first uncached position, tokens) of every prompt being computed this step
        admitted: list[tuple[int, list[int]]] = []
        # running requests still in their prompt (chunked prefill) go first
        for req in self.running:
            if budget <= 0:
                break
            if req.uncomputed > 1:
                chunk = self._chunk(req, budget)
                if chunk is None:
                    break
                chunks.append(chunk)
                budget -= chunk.end - chunk.start
                admitted.append((req.cached_len, req.all_token_ids))
        for req in self._order_waiting():
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if self._shares_prefix_with(req, admitted):
                continue
            # keep room for one more decode token for every running request
            if self.allocator.num_free + self.cache.evictable_size() < min(req.uncomputed, budget) + reserve:
                break
            if not self._admit(req):
                break
            chunk = self._chunk(req, budget)
            if chunk is None:
                self.release(req)
                req.status = Status.WAITING
                break
            self.waiting.remove(req)
            self.running.append(req)
            chunks.append(chunk)
            budget -= chunk.end - chunk.start
            reserve += 1
            admitted.append((req.cached_len, req.all_token_ids))
        return chunks

    def _shares_prefix_with(self, req: Request, admitted: list[tuple[int, list[int]]]) -> bool:
        """Whether a prompt computed this step also computes this request's next `need` uncached tokens."""
        need = self.config.in_batch_prefix_min
        if not self.cache.enabled or not admitted:
            return False
        with phase("engine.cache_match"):
            cached = self.cache.match_prefix(req.all_token_ids[:-1]).length
        end = cached + need
        tokens = req.all_token_ids[:end]
        if len(tokens) < end:
            return False
        return any(start <= cached and other[cached:end] == tokens[cached:] for start, other in admitted)

    def _chunk(self, req: Request, budget: int) -> PrefillChunk | None:
        size = min(req.uncomputed, budget, self.config.chunked_prefill_size)
        slots = self._alloc(size)
        if slots is None:
            return None
        start = req.num_computed
        self.table.write(req.row, start, slots)
        end = start + size
        return PrefillChunk(req, start, end, sample=end == req.num_tokens)
