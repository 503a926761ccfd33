"""Device idle time, classified as Holistic Trace Analysis does.

Per device stream, kernels (and copies/fills) are sorted by start; each gap between the end of one and
the start of the next is idle time, and is
- host wait: the next kernel's launch call started after the previous kernel had finished, so the
  device waited for the CPU to enqueue work (fix: fewer/fused ops, bigger batches, CUDA graphs);
- kernel wait: otherwise, if the gap is shorter than the kernel-to-kernel threshold (HTA's
  consecutive_kernel_delay, 30 ns by default): the unavoidable cost of running back-to-back kernels;
- other: the rest (cross-stream synchronisation, events, launch delays the trace cannot explain).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from vriksha.profiling.trace import DEVICE_CATEGORIES, Event, Trace


@dataclass(slots=True)
class IdleBreakdown:
    trace: str
    rank: int
    stream: str
    busy_us: float = 0.0
    host_wait_us: float = 0.0
    kernel_wait_us: float = 0.0
    other_us: float = 0.0
    gaps: int = 0

    @property
    def idle_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us


def device_idle(trace: Trace, runtime_ts: dict[int, float], kernel_gap_us: float) -> list[IdleBreakdown]:
    streams: dict[tuple[object, object], list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.cat in DEVICE_CATEGORIES:
            streams[(e.pid, e.args.get("stream", e.tid))].append(e)
    out = []
    for (pid, stream), events in sorted(streams.items(), key=lambda kv: str(kv[0])):
        events.sort(key=lambda e: e.ts)
        b = IdleBreakdown(trace.label, trace.rank, f"device {pid} stream {stream}")
        prev_end = None
        for e in events:
            b.busy_us += e.dur
            if prev_end is not None and e.ts > prev_end:
                gap = e.ts - prev_end
                b.gaps += 1
                launched = runtime_ts.get(e.correlation) if e.correlation is not None else None
                if launched is not None and launched > prev_end:
                    b.host_wait_us += gap
                elif gap < kernel_gap_us:
                    b.kernel_wait_us += gap
                else:
                    b.other_us += gap
            prev_end = e.end if prev_end is None else max(prev_end, e.end)
        out.append(b)
    return out
