"""Ordered decisions over signals: every rule whose condition holds, in file order, then the default. The
app takes the first whose pool has a live replica (a block decision ends the search)."""

from __future__ import annotations

from dataclasses import dataclass

from vriksha.semantic.config import Changes, Condition, RoutesConfig
from vriksha.semantic.signals import SignalValues


@dataclass(slots=True)
class Route:
    decision: str  # the rule's name, or "default" / "explicit" (the client named a pool)
    pool: str | None  # None: blocked
    changes: Changes | None
    reason: str
    block_status: int = 403
    block_message: str = ""


def holds(cond: Condition, values: SignalValues, why: list[str]) -> bool:
    """Whether `cond` holds; the reasons of the signals that made it hold are appended to `why`."""
    if isinstance(cond, str):
        hit = values.fired.get(cond)
        if hit is not None:
            why.append(f"{cond} ({hit.why})")
        return hit is not None
    ((op, arg),) = cond.items()
    if op == "not":
        return not holds(arg, values, [])
    mine: list[str] = []
    if op == "all":
        ok = all(holds(c, values, mine) for c in arg)
    else:
        ok = any(holds(c, values, mine) for c in arg)
    if ok:
        why.extend(mine)
    return ok


def candidates(cfg: RoutesConfig, values: SignalValues) -> list[Route]:
    out = []
    for d in cfg.decisions:
        why: list[str] = []
        if holds(d.when, values, why):
            reason = "; ".join(why) or "condition held"
            if d.action == "block":
                out.append(Route(d.name, None, None, reason, d.block_status, d.block_message))
                return out
            out.append(Route(d.name, d.pool, d, reason))
    out.append(
        Route("default", cfg.default.pool, cfg.default, "no rule matched" if not out else "fall-through")
    )
    return out
