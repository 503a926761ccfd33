"""`vriksha profile report`: the text report (and JSON) for an `Analysis`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from vriksha.profiling.analysis import TINY_OP_US, Analysis, analyze
from vriksha.profiling.trace import load_traces

COMPUTE_DEFINITION = (
    "compute = matmul/linear, convolution, attention, elementwise and activation math, normalisation, "
    "reductions and losses (see vriksha/profiling/operators.py); everything else (copies, layout, "
    "indexing, allocation, synchronisation, Python, the framework, idle) is not compute"
)


def build(paths: list[str | Path], **options: object) -> Analysis:
    """Load and analyse traces; options are `analyze`'s (threshold, kernel_gap_us, step_phase, idle_gap_ms)."""
    return analyze(load_traces(list(paths)), **options)  # type: ignore[arg-type]


def _ms(us: float) -> str:
    return f"{us / 1000:10.3f}"


def _pct(x: float) -> str:
    return f"{100 * x:6.1f}%"


def _cut(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def format_report(a: Analysis, top: int = 15) -> str:
    lines: list[str] = []
    add = lines.append
    wall = a.wall_us
    where = "device kernels" if a.device else "host operators (no device events in the trace)"
    add(
        f"vriksha profile report: {len(a.traces)} trace(s), {len(a.steps)} step(s), {wall / 1000:.3f} ms of step wall time"
    )
    for t in a.traces:
        add(f"  {t}: steps from {a.step_sources.get(t, '?')}")
    add("")
    add("Time per phase (record_function annotations; inclusive, phases may nest)")
    if a.phases:
        add(f"  {'phase':<32} {'calls':>7} {'total ms':>10} {'mean ms':>10} {'of wall':>7} {'compute':>7}")
        for p in a.phases:
            add(
                f"  {_cut(p.name, 32):<32} {p.calls:>7} {_ms(p.total_us)} {_ms(p.total_us / p.calls)} "
                f"{_pct(p.total_us / wall if wall else 0)} {_pct(p.compute_share)}"
            )
    else:
        add(
            "  (no user annotations in the trace: wrap regions in vriksha.profiling.phase or record_function)"
        )
    add("")
    add(f"Top {top} operators by self time (host)")
    if a.ops:
        total_self = sum(o.self_us for o in a.ops) or 1.0
        add(f"  {'operator':<44} {'kind':<7} {'calls':>7} {'self ms':>10} {'self %':>7} {'total ms':>10}")
        for o in a.ops[:top]:
            kind = "compute" if o.compute else "other"
            add(
                f"  {_cut(o.name, 44):<44} {kind:<7} {o.calls:>7} {_ms(o.self_us)} "
                f"{_pct(o.self_us / total_self)} {_ms(o.total_us)}"
            )
    else:
        add("  (no host operator events)")
    if a.kernels:
        add("")
        add(f"Top {top} device kernels by time")
        add(f"  {'kernel':<60} {'calls':>7} {'total ms':>10}")
        for k in a.kernels[:top]:
            add(f"  {_cut(k.name, 60):<60} {k.calls:>7} {_ms(k.total_us)}")
    add("")
    busy = "other kernels" if a.device else "other ops"
    rest = "device idle" if a.device else "no op"
    add(f"Share of wall time per step in compute ({where})")
    add(f"  {'trace':<40} {'step':>6} {'wall ms':>10} {'compute':>7} {busy:>13} {rest:>11}")
    for s in a.steps:
        w = s.wall_us or 1.0
        add(
            f"  {_cut(s.trace, 40):<40} {s.step:>6} {_ms(s.wall_us)} {_pct(s.compute_share)} "
            f"{_pct(s.other_busy_us / w):>13} {_pct(s.idle_us / w):>11}"
        )
    add(f"  {COMPUTE_DEFINITION}")
    if a.idle:
        add("")
        add("Device idle time, classified as Holistic Trace Analysis does")
        add(
            f"  {'trace / stream':<52} {'busy ms':>10} {'idle ms':>10} {'host wait':>9} {'kernel wait':>11} {'other':>7}"
        )
        for b in a.idle:
            idle = b.idle_us or 1.0
            add(
                f"  {_cut(f'{b.trace} {b.stream}', 52):<52} {_ms(b.busy_us)} {_ms(b.idle_us)} "
                f"{_pct(b.host_wait_us / idle):>9} {_pct(b.kernel_wait_us / idle):>11} {_pct(b.other_us / idle):>7}"
            )
        add(
            "  host wait: the next kernel was launched after the previous one ended (the device waited on the CPU);"
        )
        add("  kernel wait: gaps shorter than the kernel-to-kernel threshold; other: everything else")
    add("")
    add(_verdict(a))
    return "\n".join(lines)


def _verdict(a: Analysis) -> str:
    share, thr = a.compute_share, a.threshold
    where = "compute kernels on the device" if a.device else "compute operators on the host"
    lines = [
        f"Verdict: {a.verdict.upper()}: the median step spends {100 * share:.1f}% of its wall time in {where} "
        f"(all steps together: {100 * a.overall_share:.1f}%); the threshold is {100 * thr:.0f}% "
        "(below it: overhead-bound).",
    ]
    if len(a.traces) > 1:
        for t in a.traces:
            s = a.share_of(t)
            lines.append(f"  {t}: {100 * s:.1f}% compute, {'overhead-bound' if s < thr else 'compute-bound'}")
    if a.overhead_bound:
        lines.append(
            "Most time goes to Python, the framework, kernel launches, copies or waiting: batch more work per step, "
            "fuse or remove small ops (torch.compile, CUDA graphs), move host syncs (.item(), .cpu()) out of the loop."
        )
    else:
        lines.append(
            "Real arithmetic dominates: speed it up with faster kernels, lower precision, or more devices."
        )
    if not a.device and a.tiny_compute_fraction > 0.5:
        lines.append(
            f"Note: {100 * a.tiny_compute_fraction:.0f}% of compute-operator time is in calls shorter than "
            f"{TINY_OP_US:.0f} µs, where per-call dispatch, not arithmetic, dominates: the real overhead share is higher."
        )
    return "\n".join(lines)


def to_json(a: Analysis) -> str:
    d = asdict(a)
    d.update(
        compute_share=a.compute_share, overall_share=a.overall_share, verdict=a.verdict, wall_us=a.wall_us
    )
    return json.dumps(d, indent=2)
