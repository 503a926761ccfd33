"""Host operator nesting: self time, the innermost-operator timeline, and which operator launched a kernel."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from vriksha.profiling.trace import HOST_OP, RUNTIME_CATEGORIES, Event, Trace


@dataclass(slots=True)
class HostTimeline:
    self_us: dict[int, float] = field(default_factory=dict)  # id(op event) -> self time
    # (start, end, op) while `op` is the innermost running operator on its thread
    segments: list[tuple[float, float, Event]] = field(default_factory=list)
    launcher: dict[int, str] = field(default_factory=dict)  # correlation id -> launching operator name
    runtime_ts: dict[int, float] = field(default_factory=dict)  # correlation id -> launch call start


def host_timeline(trace: Trace) -> HostTimeline:
    out = HostTimeline()
    threads: dict[tuple[object, object], list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.cat == HOST_OP or e.cat in RUNTIME_CATEGORIES:
            threads[(e.pid, e.tid)].append(e)
    for events in threads.values():
        events.sort(key=lambda e: (e.ts, -e.dur))
        _sweep(events, out)
    return out


def _sweep(events: list[Event], out: HostTimeline) -> None:
    stack: list[tuple[Event, float]] = []  # (op, clamped end)
    t = 0.0

    def close_until(limit: float) -> None:
        nonlocal t
        while stack and stack[-1][1] <= limit:
            op, end = stack.pop()
            _emit(out, t, end, op)
            t = max(t, end)

    for e in events:
        close_until(e.ts)
        if e.cat in RUNTIME_CATEGORIES:
            corr = e.correlation
            if corr is not None:
                out.runtime_ts[corr] = e.ts
                if stack:
                    out.launcher[corr] = stack[-1][0].name
            continue
        if stack:
            _emit(out, t, e.ts, stack[-1][0])
        end = min(e.end, stack[-1][1]) if stack else e.end
        out.self_us.setdefault(id(e), 0.0)
        stack.append((e, end))
        t = e.ts
    close_until(float("inf"))


def _emit(out: HostTimeline, start: float, end: float, op: Event) -> None:
    if end > start:
        out.segments.append((start, end, op))
        out.self_us[id(op)] = out.self_us.get(id(op), 0.0) + (end - start)
