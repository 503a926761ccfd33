"""Speculative decoding without a draft model: propose from the sequence itself, verify in one forward.

Before a step, each decoding request that a proposer has tokens for becomes a `DraftRun`: its next token and
up to k proposed tokens are computed together (K/V written into the pool at the proposed positions), and the
model's logits at every one of those positions are sampled as one-token steps would sample them (a seeded
request's draw depends on its seed and the position only). A proposed token is kept iff it equals the token
sampled at its position; the first sampled token that differs, or the one after the last proposed token,
is kept too. So every token emitted is the one the request would have produced without speculation, and a
step emits between 1 and k + 1 tokens per request. Stop conditions are checked token by token as usual; the
slots of positions not kept go back to the free list, and the request leaves the step exactly as a run of
one-token steps would have left it (its last token not yet computed).

Requests whose sampling depends on the tokens generated so far within the step (penalties, bad words,
grammars, or `min_tokens` not yet reached) are not proposed for and decode one token at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vriksha.engine.config import EngineConfig
from vriksha.engine.core.batch import DraftRun
from vriksha.engine.core.cache_manager import CacheManager
from vriksha.engine.core.request import Request
from vriksha.engine.core.sampler import Sampler
from vriksha.engine.speculative.ngram_proposer import NgramProposer

# (request, token, its log-probability, its top log-probabilities or None) -> the request finished
Append = Callable[[Request, int, float, "dict[int, float] | None"], bool]


@dataclass(slots=True)
class SpeculationCounters:
    runs: int = 0  # request-steps that verified proposed tokens
    draft_tokens: int = 0  # tokens proposed
    accepted_tokens: int = 0  # proposed tokens that equalled the model's own
    emitted_tokens: int = 0  # tokens the draft runs emitted (accepted ones plus one per run, fewer at a stop)


class Speculator:
    def __init__(self, config: EngineConfig, max_model_len: int) -> None:
        if config.speculative != "ngram":
            raise ValueError(f"no speculative method {config.speculative!r}")
        self.proposer = NgramProposer(config.ngram_min, config.ngram_max)
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.counters = SpeculationCounters()

    @staticmethod
    def eligible(req: Request) -> bool:
        """Whether the request samples each position independently of the tokens generated in the step."""
        p = req.params
        return (
            req.grammar is None
            and not p.penalized
            and not req.bad_word_ids
            and len(req.output_token_ids) >= p.min_tokens
        )

    def room(self, req: Request) -> int:
        """Most tokens to propose: every emitted token must fit under max_tokens and the context limit."""
        return min(
            self.k,
            req.params.max_tokens - len(req.output_token_ids) - 1,
            self.max_model_len - req.num_tokens - 1,
        )

    def plan(
        self, decodes: list[Request], cache: CacheManager, budget: int
    ) -> tuple[list[Request], list[DraftRun]]:
        """Split this step's decodes (each holding its next token's slot) into plain decodes and draft runs,
        within `budget` extra tokens; a run's proposed positions get slots from the free list."""
        plain: list[Request] = []
        runs: list[DraftRun] = []
        for req in decodes:
            room = min(self.room(req), budget)
            draft = self.proposer.propose(req.all_token_ids, room) if room > 0 and self.eligible(req) else []
            if draft and cache.allocate_draft(req, len(draft)):
                runs.append(DraftRun(req, req.num_computed, draft))
                budget -= len(draft)
            else:
                plain.append(req)
        return plain, runs

    def verify(
        self, runs: list[DraftRun], logits: torch.Tensor, sampler: Sampler, append: Append
    ) -> list[Request]:
        """Sample every position of the runs (`logits`: their rows in order), emit the kept tokens through
        `append`, and return the requests that finished."""
        requests = [run.request for run in runs for _ in range(run.num_tokens)]
        offsets = [j for run in runs for j in range(run.num_tokens)]
        result = sampler(logits, requests, offsets=offsets)
        finished: list[Request] = []
        c = self.counters
        row = 0
        for run in runs:
            c.runs += 1
            c.draft_tokens += len(run.draft)
            for j in range(run.num_tokens):
                token = result.token_ids[row + j]
                done = append(run.request, token, result.logprobs[row + j], result.top_logprobs[row + j])
                c.emitted_tokens += 1
                matched = j < len(run.draft) and token == run.draft[j]
                c.accepted_tokens += matched
                if done:
                    finished.append(run.request)
                if done or not matched:
                    break
            row += run.num_tokens
        return finished

    def settle(self, run: DraftRun, cache: CacheManager) -> None:
        """After the step: the request keeps the K/V of its emitted tokens but the last (computed next step, as
        after a one-token step); the slots of the other proposed positions are freed."""
        req = run.request
        kept = req.num_tokens - 1
        cache.free_positions(req, kept, run.start + run.num_tokens)
        req.num_computed = kept
