"""What a run reports: JSON lines per step and per evaluation, TensorBoard scalars, PNG plots, a summary table.

Only rank 0 writes. `metrics.jsonl` has one object per training step, `eval.jsonl` one per
evaluation (step 0 is before training). On resume, lines past the checkpoint's step are dropped
so the files read as if the run had never stopped.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "MEASURED_PREFIXES",
    "MetricsWriter",
    "read_jsonl",
    "rollout_summary",
    "summary_table",
    "write_plots",
]

# keys that measure time or memory and so differ between otherwise identical runs
MEASURED_PREFIXES = ("time/", "perf/", "memory/")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsWriter:
    def __init__(
        self, out_dir: str | Path, enabled: bool, tensorboard: bool = True, resume_step: int | None = None
    ):
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.train_path = self.out_dir / "metrics.jsonl"
        self.eval_path = self.out_dir / "eval.jsonl"
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self._tb = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            for p in (self.train_path, self.eval_path):
                p.unlink(missing_ok=True)
        else:
            self.history = [r for r in read_jsonl(self.train_path) if r["step"] <= resume_step]
            self.evals = [r for r in read_jsonl(self.eval_path) if r["step"] <= resume_step]
            self._rewrite(self.train_path, self.history)
            self._rewrite(self.eval_path, self.evals)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"), purge_step=resume_step)
            except ImportError:
                logger.info("tensorboard is not installed; skipping TensorBoard logs")

    @staticmethod
    def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def _append(self, path: Path, row: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def log_step(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.history.append(row)
        self._append(self.train_path, row)
        self._scalars("train", row)

    def log_eval(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.evals.append(row)
        self._append(self.eval_path, row)
        self._scalars("eval", row)

    def _scalars(self, prefix: str, row: dict[str, Any]) -> None:
        if self._tb is None:
            return
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self._tb.add_scalar(f"{prefix}/{key}", value, row["step"])
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def write_plots(
    out_dir: str | Path, history: list[dict[str, Any]], evals: list[dict[str, Any]]
) -> list[Path]:
    """`reward.png` (mean training reward per step, with a moving average) and `eval_success.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    paths = []
    if history:
        steps = [r["step"] for r in history]
        reward = [r["reward/mean"] for r in history]
        k = max(1, len(reward) // 10)
        smooth = [
            sum(reward[max(0, i - k + 1) : i + 1]) / len(reward[max(0, i - k + 1) : i + 1])
            for i in range(len(reward))
        ]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, reward, alpha=0.4, label="mean reward")
        ax.plot(steps, smooth, label=f"moving average ({k})")
        ax.set_xlabel("step")
        ax.set_ylabel("training reward")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "reward.png", dpi=120)
        plt.close(fig)
        paths.append(out / "reward.png")
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([r["step"] for r in evals], [100 * r["success_rate"] for r in evals], marker="o")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out success (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "eval_success.png", dpi=120)
        plt.close(fig)
        paths.append(out / "eval_success.png")
    return paths


def summary_table(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """The before/after table as Markdown (also what the console shows)."""
    rows = [("held-out success", "success_rate", 100.0, "%"), ("held-out reward", "reward", 1.0, "")]
    lines = ["| metric | before | after | change |", "|---|---|---|---|"]
    for label, key, scale, unit in rows:
        b = None if before is None else before.get(key)
        a = None if after is None else after.get(key)
        fb = "n/a" if b is None else f"{scale * b:.1f}{unit}" if unit else f"{b:.3f}"
        fa = "n/a" if a is None else f"{scale * a:.1f}{unit}" if unit else f"{a:.3f}"
        delta = (
            "n/a"
            if a is None or b is None
            else (f"{scale * (a - b):+.1f}{unit}" if unit else f"{a - b:+.3f}")
        )
        lines.append(f"| {label} | {fb} | {fa} | {delta} |")
    episodes = (after or before or {}).get("episodes")
    if episodes:
        lines.append(f"\n({episodes} held-out episodes, greedy decoding)")
    return "\n".join(lines)


def rollout_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the whole run: steps per hour of training time and, for off-policy runs, the staleness
    histogram (groups trained per lag), its mean and the groups dropped."""
    seconds = sum(r.get("time/step_s", 0.0) for r in history)
    out: dict[str, Any] = {"steps_per_hour": 3600.0 * len(history) / seconds if seconds > 0 else None}
    hists = [r["async/staleness_hist"] for r in history if "async/staleness_hist" in r]
    if hists:
        total = [sum(h[i] for h in hists if i < len(h)) for i in range(max(len(h) for h in hists))]
        groups = sum(total)
        out["staleness_hist"] = total
        out["staleness_mean"] = sum(i * n for i, n in enumerate(total)) / groups if groups else None
        out["dropped_groups"] = history[-1].get("async/dropped_total", 0)
    return out
