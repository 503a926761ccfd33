"""Ordered decisions over signals: every rule whose condition holds, in file order, then the default. The
app takes the first whose pool has a live replica (a block decision ends the search).

Conditions are evaluated in three values while the embedding signals are still pending (not computed):
a rule is taken or passed over when the cheap signals (keywords, regexes, safety) settle it either way, and
the walk stops at the first rule that needs an embedding signal. So a request the cheap signals route
(a jailbreak blocked, PII sent to a pool) is never embedded, unless a later step needs the embedding."""

from __future__ import annotations

from dataclasses import dataclass

from vriksha.router.semantic.config import Changes, Condition, RoutesConfig
from vriksha.router.semantic.signals import SignalValues


@dataclass(slots=True)
class Route:
    decision: str  # the rule's name, or "default" / "explicit" (the client named a pool)
    pool: str | None  # None: blocked
    changes: Changes | None
    reason: str
    block_status: int = 403
    block_message: str = ""


def holds(cond: Condition, values: SignalValues, why: list[str]) -> bool | None:
    """Whether `cond` holds (None: it depends on a pending signal); the reasons of the signals that made it
    hold are appended to `why`."""
    if isinstance(cond, str):
        if cond.partition(":")[0] in values.pending:
            return None
        hit = values.fired.get(cond)
        if hit is not None:
            why.append(f"{cond} ({hit.why})")
        return hit is not None
    ((op, arg),) = cond.items()
    if op == "not":
        inner = holds(arg, values, [])
        return None if inner is None else not inner
    mine: list[str] = []
    unknown = False
    for c in arg:
        r = holds(c, values, mine)
        if r is None:
            unknown = True
        elif r == (op == "any"):  # one true settles an any, one false an all
            if r:
                why.extend(mine)
            return r
    if unknown:
        return None
    if op == "all":
        why.extend(mine)
    return op == "all"


def settled(cfg: RoutesConfig, values: SignalValues) -> tuple[list[Route], bool]:
    """The candidate routes the known signals settle, in order, and whether that is all of them (False: the
    next rule depends on a pending signal; compute it and call `candidates`)."""
    out = []
    for d in cfg.decisions:
        why: list[str] = []
        ok = holds(d.when, values, why)
        if ok is None:
            return out, False
        if ok:
            reason = "; ".join(why) or "condition held"
            if d.action == "block":
                out.append(Route(d.name, None, None, reason, d.block_status, d.block_message))
                return out, True
            out.append(Route(d.name, d.pool, d, reason))
    out.append(
        Route("default", cfg.default.pool, cfg.default, "no rule matched" if not out else "fall-through")
    )
    return out, True


def candidates(cfg: RoutesConfig, values: SignalValues) -> list[Route]:
    """Every candidate route (no signal may be pending)."""
    routes, complete = settled(cfg, values)
    assert complete, f"signals {sorted(values.pending)} are still pending"
    return routes
