"""Routing policies: given the prompt's token ids and the healthy replicas, pick one and say why.

- round_robin: in turn.
- least_load: the fewest requests in flight (router's count, or the replica's running + waiting if more).
- cache_aware: SGLang's router method: an approximate tree of the prompts routed to each replica; when load
  is balanced, the replica with the longest match if its match rate beats `cache_threshold`, else the one with
  the smallest tree; when unbalanced (abs and rel thresholds), the least loaded.
- precise: each replica's real radix tree (mirrored from its KV events) gives the uncached tokens; with its
  load they make an estimated time to first token; the replica holding the longest prefix keeps the request
  unless its estimate is worse than the best by more than `affinity_bound_tokens` (llm-d's affinity rule).
  Only a prefix that is a real part of the prompt binds it there: the tokens the holder has beyond the best
  replica must be at least `affinity_min_share` of the prompt. A few leading tokens every prompt shares (a
  chat template's header, a common first word) would otherwise pile every request onto the first replica
  that saw them, whose pool, when bounded, then cycles through all the prefixes and keeps none.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from vriksha.kv_events.token_tree import TokenTree
from vriksha.router.config import RouterConfig
from vriksha.router.replica import Replica


@dataclass(slots=True)
class Decision:
    replica: Replica
    reason: str  # round_robin | load | prefix | balance | session | retry
    cached_tokens: int = 0


class Policy:
    name = "policy"

    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def choose(self, tokens: list[int], replicas: list[Replica]) -> Decision:
        raise NotImplementedError

    def routed(self, decision: Decision, tokens: list[int]) -> None:
        """The request went to `decision.replica` (policies that learn from their own choices)."""


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self._next = itertools.count()

    def choose(self, tokens: list[int], replicas: list[Replica]) -> Decision:
        return Decision(replicas[next(self._next) % len(replicas)], "round_robin")


def _least_loaded(replicas: list[Replica]) -> Replica:
    return min(replicas, key=lambda r: (r.queue, r.load.kv_usage, r.index))


class LeastLoad(Policy):
    name = "least_load"

    def choose(self, tokens: list[int], replicas: list[Replica]) -> Decision:
        return Decision(_least_loaded(replicas), "load")


class CacheAware(Policy):
    name = "cache_aware"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.trees: dict[int, TokenTree] = {}

    def _tree(self, r: Replica) -> TokenTree:
        return self.trees.setdefault(r.index, TokenTree())

    def choose(self, tokens: list[int], replicas: list[Replica]) -> Decision:
        c = self.config
        loads = [r.queue for r in replicas]
        if max(loads) - min(loads) > c.balance_abs_threshold and max(loads) > c.balance_rel_threshold * min(
            loads
        ):
            return Decision(_least_loaded(replicas), "balance")
        matches = [self._tree(r).match(tokens) for r in replicas]
        best = max(range(len(replicas)), key=lambda i: (matches[i], -loads[i]))
        if tokens and matches[best] / len(tokens) > c.cache_threshold:
            return Decision(replicas[best], "prefix", matches[best])
        smallest = min(replicas, key=lambda r: (self._tree(r).size, r.queue, r.index))
        return Decision(smallest, "load")

    def routed(self, decision: Decision, tokens: list[int]) -> None:
        tree = self._tree(decision.replica)
        tree.insert(tokens)
        if tree.size > self.config.max_tree_tokens:
            tree.evict_to(self.config.max_tree_tokens * 9 // 10)


class Precise(Policy):
    name = "precise"

    def estimate(self, r: Replica, uncached: int) -> float:
        c = self.config
        return uncached + c.queue_cost_tokens * r.queue + c.kv_cost_tokens * r.load.kv_usage

    def choose(self, tokens: list[int], replicas: list[Replica]) -> Decision:
        hits = [r.cached_prefix(tokens) for r in replicas]
        est = [self.estimate(r, len(tokens) - h) for r, h in zip(replicas, hits, strict=True)]
        fastest = min(range(len(replicas)), key=lambda i: (est[i], replicas[i].index))
        holder = max(range(len(replicas)), key=lambda i: (hits[i], -est[i]))
        c = self.config
        binding = hits[holder] - hits[fastest] >= c.affinity_min_share * len(tokens)
        close = binding and est[holder] - est[fastest] <= c.affinity_bound_tokens
        if hits[holder] > 0 and (holder == fastest or close):
            return Decision(replicas[holder], "prefix", hits[holder])
        return Decision(replicas[fastest], "load", hits[fastest])

    def routed(self, decision: Decision, tokens: list[int]) -> None:
        decision.replica.add_pending(tokens, self.config.pending_ttl_s)


def make_policy(config: RouterConfig) -> Policy:
    kinds = {p.name: p for p in (RoundRobin, LeastLoad, CacheAware, Precise)}
    return kinds[config.policy](config)
