"""Continuous batching: which requests run this step, and the KV memory they need.

Every step carries all running decodes plus prefill chunks within the token budget (prefill-first for the
waiting queue, chunked for long prompts). The waiting queue is ordered by longest cached prefix (FCFS past
`lpm_max_queue`), then shared fairly among the user requests waiting: a free seat goes to the sequence whose
request holds the fewest running and earlier-picked sequences (ties in queue order), so that a request with
thousands of sequences (`n`, or a batch of prompts) cannot keep a two-token request waiting behind all of them. A prompt that shares a long uncached prefix with one admitted in the same step waits one
step so that it reads that prefix from the cache instead of computing it again. When KV memory runs out the
cache is evicted first (unpinned entries, then the youngest sessions' pins), then the newest running requests are retracted (their KV goes to the cache, and
they recompute what was evicted when they return). Every question about KV memory goes to the cache manager;
after the forward pass `postprocess` does the step's bookkeeping in one place.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import TYPE_CHECKING

from vriksha.engine.config import EngineConfig
from vriksha.engine.core.batch import ForwardBatch, PrefillChunk
from vriksha.engine.core.cache_manager import CacheManager
from vriksha.engine.core.request import Request, Status
from vriksha.profiling import phase

if TYPE_CHECKING:
    from vriksha.engine.speculative.speculator import Speculator

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self, config: EngineConfig, cache: CacheManager, speculator: Speculator | None = None
    ) -> None:
        """`speculator`: proposes draft tokens for decoding requests (speculative decoding), or None."""
        self.config = config
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_retracted = 0
        self.speculator = speculator

    # ---- queue -------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request) -> None:
        self.cache.release(req)
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
        self.cache.release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.num_retracted += 1
        logger.info("KV memory short: retracted %s/%d (%d tokens)", req.request_id, req.index, req.num_tokens)

    # ---- after the forward pass --------------------------------------------------------------------
    def postprocess(self, batch: ForwardBatch, finished: list[Request]) -> None:
        """The step ran: advance what each request has computed, cache the prefill chunks' tokens, and
        release the requests that finished (their KV goes to the cache)."""
        for req in batch.decodes:
            req.num_computed += 1
        for run in batch.drafts:
            self.speculator.settle(run, self.cache)
        for chunk in batch.prefills:
            chunk.request.num_computed = chunk.end
            self.cache.cache_req(chunk.request, finished=False)
        for req in finished:
            self.finish(req)

    # ---- admission ---------------------------------------------------------------------------------
    def _admit(self, req: Request) -> bool:
        """Give a waiting request a table row and its cached prefix. False when no row is free."""
        if not self.cache.admit(req):
            return False
        if not req.admitted_once:
            req.num_cached_prompt_tokens = min(req.cached_len, len(req.prompt_token_ids))
            req.admitted_once = True
        req.status = Status.RUNNING
        return True

    def _order_waiting(self) -> list[Request]:
        if len(self.waiting) > self.config.lpm_max_queue or len(self.waiting) < 2:
            return fair_order(list(self.waiting), self.running)
        matched = {id(r): self.cache.match_len(r.all_token_ids[:-1], r.lora_id) for r in self.waiting}
        return fair_order(sorted(self.waiting, key=lambda r: -matched[id(r)]), self.running)

    # ---- one step ----------------------------------------------------------------------------------
    def schedule(self) -> ForwardBatch:
        with phase("engine.schedule"):
            decodes = self._schedule_decodes()
            budget = self.config.max_num_batched_tokens - len(decodes)
            reserve = len(decodes)
            drafts = []
            if self.speculator is not None and decodes:
                decodes, drafts = self.speculator.plan(decodes, self.cache, budget)
                budget -= sum(len(r.draft) for r in drafts)
            prefills = self._schedule_prefills(budget, reserve=reserve)
            return ForwardBatch(decodes=decodes, prefills=prefills, drafts=drafts)

    def _schedule_decodes(self) -> list[Request]:
        decodes = [r for r in self.running if r.uncomputed == 1]
        need = len(decodes)
        if need and self.cache.num_free < need:
            self.cache.evict(need - self.cache.num_free)
        while decodes and self.cache.num_free < len(decodes):
            victim = max(self.running, key=lambda r: r.arrival_time)
            if victim in decodes:
                decodes.remove(victim)
            self._retract(victim)
        if decodes:
            self.cache.allocate_decodes(decodes)
        return decodes

    def _schedule_prefills(self, budget: int, reserve: int) -> list[PrefillChunk]:
        chunks: list[PrefillChunk] = []
        # (first uncached position, tokens) of every prompt being computed this step
        admitted: list[tuple[int, list[int], int]] = []  # ... and the LoRA adapter they run with
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
                admitted.append((req.cached_len, req.all_token_ids, req.lora_id))
        if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return chunks  # no seat: the waiting queue need not be ordered
        for req in self._order_waiting():
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            same_adapter = [(start, ids) for start, ids, lora in admitted if lora == req.lora_id]
            if self.cache.prefix_in_flight(
                req.all_token_ids, same_adapter, self.config.in_batch_prefix_min, req.lora_id
            ):
                continue
            # keep room for one more decode token for every running request
            need = min(req.uncomputed, budget) + reserve
            if self.cache.available() < need:
                # sessions' pins give way only when nothing else will free memory (nothing is running)
                if self.running or chunks or not self.cache.release_pins_for(need):
                    break
            if not self._admit(req):
                break
            chunk = self._chunk(req, budget)
            if chunk is None:
                self.cache.release(req)
                req.status = Status.WAITING
                break
            self.waiting.remove(req)
            self.running.append(req)
            chunks.append(chunk)
            budget -= chunk.end - chunk.start
            reserve += 1
            admitted.append((req.cached_len, req.all_token_ids, req.lora_id))
        return chunks

    def _chunk(self, req: Request, budget: int) -> PrefillChunk | None:
        size = min(req.uncomputed, budget, self.config.chunked_prefill_size)
        if not self.cache.allocate(req, size):
            return None
        start = req.num_computed
        end = start + size
        return PrefillChunk(req, start, end, sample=end == req.num_tokens)


def fair_order(order: list[Request], running: list[Request]) -> list[Request]:
    """`order` interleaved across user requests: the j-th waiting sequence of a request that runs `r` sequences
    ranks at r + j, ties going to the request first in `order`. One request waiting: `order` unchanged."""
    first_seen: dict[str, int] = {}
    for req in order:
        first_seen.setdefault(req.request_id, len(first_seen))
    held = Counter(r.request_id for r in running if r.request_id in first_seen)
    if len(first_seen) < 2 or (len(first_seen) == len(order) and not held):
        return order  # one request, or one sequence each and none running: every rank is 0
    picked: Counter[str] = Counter()
    ranked = []
    for req in order:
        rid = req.request_id
        ranked.append((held[rid] + picked[rid], first_seen[rid], len(ranked), req))
        picked[rid] += 1
    ranked.sort(key=lambda t: t[:3])
    return [t[3] for t in ranked]
