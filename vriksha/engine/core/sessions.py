"""Open sessions and the prefix each one pins in the radix cache.

A session is a run of requests that continue one another (the turns of an agent's episode). While it is open,
the tokens of its last finished turn stay locked in the tree, so that the next turn, which arrives after a tool
call, finds them instead of recomputing what LRU eviction would have dropped meanwhile. Pins are bounded: their
tokens together stay within `capacity`. Older sessions come first: past the capacity (or when a running request
needs the memory) the youngest session's pin gives way, and a session younger than every pinned one is not
pinned, so that a stable set of trajectories stays resident rather than all of them taking turns to be evicted
(what LRU does to a cyclic working set larger than the pool); as episodes end, younger ones take their place. A
session idle for `timeout_s` is closed; a closed session releases its pin. The table only keeps the books: the
cache manager locks and unlocks the nodes it is told about.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vriksha.engine.core.radix_cache import TreeNode


@dataclass(slots=True)
class Pin:
    """One session's pinned prefix: the node that ends at its last token, in the tree of adapter `lora_id`."""

    lora_id: int
    node: TreeNode
    tokens: int


@dataclass(slots=True)
class Session:
    session_id: str
    last_use: float
    opened: int  # order of opening: lower is older
    pin: Pin | None = None


@dataclass(slots=True)
class SessionCounters:
    opened: int = 0
    closed: int = 0  # closed by the client (end of episode, explicit close)
    timed_out: int = 0
    # pins released because the pinned share was full (oldest first) or a running request needed the memory
    released_over_share: int = 0
    released_for_memory: int = 0


Unpin = Callable[[Pin], None]


@dataclass(eq=False)
class SessionTable:
    capacity: int  # most tokens all pins together may hold
    timeout_s: float
    unpin: Unpin  # unlocks a pin's node in its tree
    clock: Callable[[], float] = time.monotonic
    sessions: OrderedDict[str, Session] = field(default_factory=OrderedDict)  # least recently used first
    pinned_tokens: int = 0
    counters: SessionCounters = field(default_factory=SessionCounters)
    _opened: int = 0

    def touch(self, session_id: str) -> None:
        """A request of `session_id` arrived: open the session, or mark it used now."""
        self.expire()
        session = self.sessions.get(session_id)
        if session is None:
            self._opened += 1
            self.sessions[session_id] = Session(session_id, self.clock(), self._opened)
            self.counters.opened += 1
        else:
            session.last_use = self.clock()
            self.sessions.move_to_end(session_id)

    def pin(self, session_id: str, pin: Pin) -> bool:
        """Make `pin` (already locked by the caller) the session's pin, releasing its previous one; younger
        sessions' pins are released while the total would pass the capacity. False (the caller unlocks `pin`
        itself) when the session is closed, or the pin does not fit beside the older sessions' pins."""
        session = self.sessions.get(session_id)
        if session is None:
            return False
        self._release(session)
        while self.pinned_tokens + pin.tokens > self.capacity:
            youngest = self._youngest_pinned()
            if youngest is None or youngest.opened < session.opened:
                return False
            self._release(youngest)
            self.counters.released_over_share += 1
        session.pin = pin
        session.last_use = self.clock()
        self.sessions.move_to_end(session_id)
        self.pinned_tokens += pin.tokens
        return True

    def close(self, session_id: str) -> bool:
        """Close the session and release its pin; False when no such session is open."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        self._release(session)
        self.counters.closed += 1
        return True

    def release_all(self, lora_id: int | None = None) -> int:
        """Release every pin (of adapter `lora_id` only, when given); the sessions stay open. Returns how many."""
        n = 0
        for session in self.sessions.values():
            if session.pin is not None and (lora_id is None or session.pin.lora_id == lora_id):
                self._release(session)
                n += 1
        return n

    def release_youngest(self) -> int:
        """Release the youngest session's pin (the memory is needed); returns its tokens (0: no pin left). The
        session stays open: its next turn may pin again."""
        session = self._youngest_pinned()
        if session is None or session.pin is None:
            return 0
        tokens = session.pin.tokens
        self._release(session)
        self.counters.released_for_memory += 1
        return tokens

    def _youngest_pinned(self) -> Session | None:
        pinned = [s for s in self.sessions.values() if s.pin is not None]
        return max(pinned, key=lambda s: s.opened) if pinned else None

    def expire(self) -> int:
        """Close every session idle past the timeout; returns how many."""
        deadline = self.clock() - self.timeout_s
        n = 0
        while self.sessions:
            session = next(iter(self.sessions.values()))
            if session.last_use > deadline:
                break
            del self.sessions[session.session_id]
            self._release(session)
            self.counters.timed_out += 1
            n += 1
        return n

    def _release(self, session: Session) -> None:
        if session.pin is not None:
            self.pinned_tokens -= session.pin.tokens
            self.unpin(session.pin)
            session.pin = None

    @property
    def num_open(self) -> int:
        return len(self.sessions)

    @property
    def num_pinned(self) -> int:
        return sum(1 for s in self.sessions.values() if s.pin is not None)
