"""Turn loaded traces into numbers: phases, operators, per-step compute share, device idle gaps, verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

from vriksha.profiling.gaps import IdleBreakdown, device_idle
from vriksha.profiling.intervals import Interval, covered, merge
from vriksha.profiling.operators import is_compute_kernel, is_compute_op
from vriksha.profiling.timeline import HostTimeline, host_timeline
from vriksha.profiling.trace import DEVICE_CATEGORIES, HOST_OP, STEP_PREFIX, USER_ANNOTATION, Trace

DEFAULT_THRESHOLD = 0.5
DEFAULT_KERNEL_GAP_US = 0.03  # Holistic Trace Analysis' consecutive_kernel_delay: 30 ns
DEFAULT_IDLE_GAP_MS = 100.0  # traces without step marks: longer silences separate busy windows
TINY_OP_US = 20.0


@dataclass(slots=True)
class StepStat:
    trace: str
    rank: int
    step: str
    wall_us: float
    compute_us: float  # compute operators (host) or compute kernels (device)
    other_busy_us: float  # other operators (host) or copies/fills (device)

    @property
    def idle_us(self) -> float:
        return max(self.wall_us - self.compute_us - self.other_busy_us, 0.0)

    @property
    def compute_share(self) -> float:
        return self.compute_us / self.wall_us if self.wall_us > 0 else 0.0


@dataclass(slots=True)
class PhaseStat:
    name: str
    calls: int = 0
    total_us: float = 0.0
    compute_us: float = 0.0

    @property
    def compute_share(self) -> float:
        return self.compute_us / self.total_us if self.total_us > 0 else 0.0


@dataclass(slots=True)
class OpStat:
    name: str
    compute: bool
    calls: int = 0
    self_us: float = 0.0
    total_us: float = 0.0


@dataclass(slots=True)
class Analysis:
    traces: list[str]
    device: bool  # the share is measured on device kernels (else on host operators)
    threshold: float
    steps: list[StepStat] = field(default_factory=list)
    phases: list[PhaseStat] = field(default_factory=list)
    ops: list[OpStat] = field(default_factory=list)
    kernels: list[OpStat] = field(default_factory=list)
    idle: list[IdleBreakdown] = field(default_factory=list)
    step_sources: dict[str, str] = field(default_factory=dict)  # trace label -> how its steps were found
    tiny_compute_fraction: float = 0.0  # share of host compute-op time in calls shorter than TINY_OP_US

    @property
    def wall_us(self) -> float:
        return sum(s.wall_us for s in self.steps)

    @property
    def compute_share(self) -> float:
        """The median step's compute share: robust to one step stretched by a preemption or a stall."""
        return _median([s.compute_share for s in self.steps])

    @property
    def overall_share(self) -> float:
        """All steps together: total compute time over total step wall time."""
        wall = self.wall_us
        return sum(s.compute_us for s in self.steps) / wall if wall > 0 else 0.0

    @property
    def overhead_bound(self) -> bool:
        return self.compute_share < self.threshold

    @property
    def verdict(self) -> str:
        return "overhead-bound" if self.overhead_bound else "compute-bound"

    def share_of(self, trace: str) -> float:
        return _median([s.compute_share for s in self.steps if s.trace == trace])


def _median(xs: list[float]) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _steps(
    trace: Trace, step_phase: str | None, idle_gap_us: float
) -> tuple[str, list[tuple[str, float, float]]]:
    """Step windows: `step_phase` occurrences if asked, else ProfilerStep# marks, else busy windows."""
    name = step_phase or STEP_PREFIX
    marks = sorted(
        (
            e
            for e in trace.events
            if e.cat == USER_ANNOTATION and (e.name == name if step_phase else e.name.startswith(STEP_PREFIX))
        ),
        key=lambda e: e.ts,
    )
    if marks:
        source = f"each '{step_phase}' annotation" if step_phase else "ProfilerStep#N marks"
        return source, [
            (m.name.removeprefix(STEP_PREFIX) if not step_phase else str(i), m.ts, m.end)
            for i, m in enumerate(marks)
        ]
    # No step marks (e.g. a /start_profile../stop_profile capture): stretches of activity separated by
    # more than `idle_gap_us` of nothing are steps; the long silences are waiting for work, not overhead.
    active = merge(
        (e.ts, e.end)
        for e in trace.events
        if e.cat in (HOST_OP, USER_ANNOTATION) or e.cat in DEVICE_CATEGORIES
    )
    windows: list[Interval] = []
    for s, e in active:
        if windows and s - windows[-1][1] <= idle_gap_us:
            windows[-1] = (windows[-1][0], max(windows[-1][1], e))
        else:
            windows.append((s, e))
    missing = f"no '{step_phase}' annotations, so " if step_phase else ""
    source = f"{missing}busy windows (activity split at silences over {idle_gap_us / 1000:g} ms)"
    if len(windows) == 1:
        return source, [("all", *windows[0])]
    return source, [(f"busy{i}", s, e) for i, (s, e) in enumerate(windows)]


def _busy(trace: Trace, tl: HostTimeline, device: bool) -> tuple[list[Interval], list[Interval]]:
    """(compute intervals, all busy intervals), merged."""
    if device:
        dev = [e for e in trace.events if e.cat in DEVICE_CATEGORIES]
        comp = [
            (e.ts, e.end)
            for e in dev
            if e.cat == "kernel" and is_compute_kernel(e.name, tl.launcher.get(e.correlation or -1))
        ]
        return merge(comp), merge((e.ts, e.end) for e in dev)
    comp = [(s, e) for s, e, op in tl.segments if is_compute_op(op.name)]
    return merge(comp), merge((s, e) for s, e, _ in tl.segments)


def analyze(
    traces: list[Trace],
    threshold: float = DEFAULT_THRESHOLD,
    kernel_gap_us: float = DEFAULT_KERNEL_GAP_US,
    step_phase: str | None = None,
    idle_gap_ms: float = DEFAULT_IDLE_GAP_MS,
) -> Analysis:
    device = any(t.has_device for t in traces)
    out = Analysis(traces=[t.label for t in traces], device=device, threshold=threshold)
    phases: dict[str, PhaseStat] = {}
    ops: dict[str, OpStat] = {}
    kernels: dict[str, OpStat] = {}
    compute_calls: list[float] = []
    for trace in traces:
        tl = host_timeline(trace)
        compute, busy = _busy(trace, tl, device and trace.has_device)
        source, windows = _steps(trace, step_phase, idle_gap_ms * 1000)
        out.step_sources[trace.label] = source
        for name, start, end in windows:
            c, b = covered(compute, start, end), covered(busy, start, end)
            out.steps.append(StepStat(trace.label, trace.rank, name, end - start, c, b - c))
        for e in trace.events:
            if e.cat == USER_ANNOTATION and not e.name.startswith(STEP_PREFIX) and e.name != step_phase:
                p = phases.setdefault(e.name, PhaseStat(e.name))
                p.calls += 1
                p.total_us += e.dur
                p.compute_us += covered(compute, e.ts, e.end)
            elif e.cat == HOST_OP:
                o = ops.get(e.name) or ops.setdefault(e.name, OpStat(e.name, is_compute_op(e.name)))
                o.calls += 1
                o.total_us += e.dur
                o.self_us += tl.self_us.get(id(e), 0.0)
            elif e.cat in DEVICE_CATEGORIES:
                k = kernels.setdefault(e.name, OpStat(e.name, e.cat == "kernel"))
                k.calls += 1
                k.total_us += e.dur
                k.self_us += e.dur
        compute_calls += [
            tl.self_us.get(id(e), 0.0) for e in trace.events if e.cat == HOST_OP and is_compute_op(e.name)
        ]
        if trace.has_device:
            out.idle += device_idle(trace, tl.runtime_ts, kernel_gap_us)
    out.phases = sorted(phases.values(), key=lambda p: -p.total_us)
    out.ops = sorted(ops.values(), key=lambda o: -o.self_us)
    out.kernels = sorted(kernels.values(), key=lambda k: -k.total_us)
    total_compute = sum(compute_calls)
    if total_compute > 0:
        out.tiny_compute_fraction = sum(c for c in compute_calls if c < TINY_OP_US) / total_compute
    return out
