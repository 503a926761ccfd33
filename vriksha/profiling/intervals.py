"""Interval arithmetic on (start, end) pairs in microseconds."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of the given intervals (empty ones dropped)."""
    out: list[Interval] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def length(merged: list[Interval]) -> float:
    return sum(e - s for s, e in merged)


def covered(merged: list[Interval], start: float, end: float) -> float:
    """How much of [start, end] the merged (sorted, disjoint) intervals cover."""
    if end <= start or not merged:
        return 0.0
    i = max(bisect.bisect_right(merged, (start, float("inf"))) - 1, 0)
    total = 0.0
    while i < len(merged) and merged[i][0] < end:
        s, e = merged[i]
        total += max(0.0, min(e, end) - max(s, start))
        i += 1
    return total
