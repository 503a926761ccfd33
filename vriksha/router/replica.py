"""One replica as the router sees it: health, load (polled from `/load`, plus the router's own in-flight
count), its KV event mirror, and what was routed there but not yet confirmed by events."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from vriksha.prefix_tree import common_prefix_len
from vriksha.router.config import ReplicaSpec
from vriksha.router.subscriber import EventSubscriber


@dataclass(slots=True)
class Load:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    router_in_flight: int = 0  # this router's requests open on the replica when it answered

    @property
    def others(self) -> int:
        """Requests the replica serves or holds that did not come through this router (other routers, direct
        clients), as of the poll."""
        return max(0, self.num_running + self.num_waiting - self.router_in_flight)


@dataclass(slots=True)
class Replica:
    spec: ReplicaSpec
    index: int
    healthy: bool = False
    in_flight: int = 0
    load: Load = field(default_factory=Load)
    events: EventSubscriber | None = None
    # prompts routed here whose KV events have not arrived yet: (expiry, tokens)
    pending: list[tuple[float, list[int]]] = field(default_factory=list)
    failures: int = 0
    soonest_expiry: float = math.inf  # of `pending`: expired entries are dropped only once one is due

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def queue(self) -> int:
        """Requests this replica is serving or holding: the router's own, counted exactly as they open and
        close, plus the others the last poll saw. (A poll up to `load_interval_s` old still counts requests
        that have finished since; taking it whole would make a replica that just freed up look busy.)"""
        return self.in_flight + self.load.others

    def cached_prefix(self, tokens: list[int]) -> int:
        """Tokens of `tokens` this replica holds (mirror) or will hold shortly (pending)."""
        best = self.events.tree.match(tokens) if self.events is not None and self.events.synced else 0
        if self.pending and tokens:
            now = time.monotonic()
            if now >= self.soonest_expiry:
                self.pending = [p for p in self.pending if p[0] > now]
                self.soonest_expiry = min((p[0] for p in self.pending), default=math.inf)
            n = len(tokens)
            for _, p in self.pending:
                if best >= n:
                    break
                # p can beat `best` only if it also agrees at position `best`: an O(1) test first
                if len(p) > best and p[best] == tokens[best]:
                    best = max(best, common_prefix_len(p, tokens))
        return best

    def add_pending(self, tokens: list[int], ttl_s: float, cap: int = 256) -> None:
        expiry = time.monotonic() + ttl_s
        self.pending.append((expiry, tokens))
        self.soonest_expiry = min(self.soonest_expiry, expiry)
        if len(self.pending) > cap:
            del self.pending[0]

    def settle_pending(self, tokens: list[int], grace_s: float = 0.5) -> None:
        """The request for `tokens` ended: its KV events are due within moments, stop assuming them soon."""
        for i, (expiry, p) in enumerate(self.pending):
            if p is tokens:
                expiry = min(expiry, time.monotonic() + grace_s)
                self.pending[i] = (expiry, p)
                self.soonest_expiry = min(self.soonest_expiry, expiry)
                return
