"""The PNG breakdown chart written by `vriksha profile report --out`."""

from __future__ import annotations

import logging
from pathlib import Path

from vriksha.profiling.analysis import Analysis

logger = logging.getLogger(__name__)


def write_chart(a: Analysis, out: Path, top: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 + (1 if a.idle else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(11, 3.2 * panels + 1), constrained_layout=True)
    fig.suptitle(
        f"{a.verdict}: median step {100 * a.compute_share:.1f}% of wall time in compute "
        f"({'device kernels' if a.device else 'host operators'}; threshold {100 * a.threshold:.0f}%)"
    )

    ax = axes[0]
    labels = [f"r{s.rank}:{s.step}" for s in a.steps]
    x = range(len(a.steps))
    compute = [100 * s.compute_share for s in a.steps]
    other = [100 * s.other_busy_us / s.wall_us if s.wall_us else 0 for s in a.steps]
    idle = [max(100 - c - o, 0) for c, o in zip(compute, other, strict=True)]
    ax.bar(x, compute, color="#2a9d8f", label="compute")
    ax.bar(
        x, other, bottom=compute, color="#e9c46a", label="other kernels" if a.device else "other operators"
    )
    ax.bar(
        x,
        idle,
        bottom=[c + o for c, o in zip(compute, other, strict=True)],
        color="#e76f51",
        label="device idle" if a.device else "no operator (Python, framework, waiting)",
    )
    ax.axhline(100 * a.threshold, color="black", linestyle="--", linewidth=1, label="threshold")
    ax.set_xticks(list(x), labels, rotation=45 if len(labels) > 8 else 0, fontsize=8)
    ax.set_ylabel("% of step wall time")
    ax.set_ylim(0, 100)
    ax.set_title("per-step breakdown")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, frameon=False)

    ax = axes[1]
    phases = a.phases[:top][::-1]
    ax.barh([_short(p.name) for p in phases], [p.total_us / 1000 for p in phases], color="#264653")
    ax.set_xlabel("ms (inclusive)")
    ax.set_title("time per phase" if phases else "time per phase (no annotations in the trace)")

    ax = axes[2]
    ops = a.ops[:top][::-1]
    ax.barh(
        [_short(o.name) for o in ops],
        [o.self_us / 1000 for o in ops],
        color=["#2a9d8f" if o.compute else "#e9c46a" for o in ops],
    )
    ax.set_xlabel("self ms")
    ax.set_title("top operators by self time (green: compute)")

    if a.idle:
        ax = axes[3]
        names = [f"r{b.rank} {b.stream}" for b in a.idle]
        hw = [b.host_wait_us / 1000 for b in a.idle]
        kw = [b.kernel_wait_us / 1000 for b in a.idle]
        ot = [b.other_us / 1000 for b in a.idle]
        ax.barh(names, hw, color="#e76f51", label="host wait")
        ax.barh(names, kw, left=hw, color="#f4a261", label="kernel wait")
        ax.barh(names, ot, left=[h + k for h, k in zip(hw, kw, strict=True)], color="#8d99ae", label="other")
        ax.set_xlabel("idle ms")
        ax.set_title("device idle time (HTA classification)")
        ax.legend(fontsize=8)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    logger.info("wrote chart %s", out)
    return out


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"
