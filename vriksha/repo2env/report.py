"""The yield report: candidates tried, tasks kept, drops by reason, time per kept task."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

__all__ = ["YieldReport"]


@dataclass(slots=True)
class YieldReport:
    repo: str = ""
    bootstrap_s: float = 0.0
    baseline_s: float = 0.0
    tests: int = 0
    stable_passing: int = 0
    flaky_tests: int = 0
    candidates: Counter = field(default_factory=Counter)  # pipeline -> tried
    covered: Counter = field(default_factory=Counter)  # pipeline -> tried with a covering test
    kept: Counter = field(default_factory=Counter)  # pipeline -> tasks kept
    drops: Counter = field(default_factory=Counter)  # reason -> count
    drops_by_pipeline: dict[str, Counter] = field(default_factory=dict)
    kept_seconds: float = 0.0  # validation time summed over kept tasks
    wall_s: float = 0.0
    sandbox: dict = field(default_factory=dict)  # isolation of the test runs, and what was missing
    result_warnings: list[str] = field(default_factory=list)  # test results refused as forged or malformed

    def add_drop(self, pipeline: str, reason: str, covered: bool) -> None:
        self.candidates[pipeline] += 1
        self.covered[pipeline] += int(covered)
        self.drops[reason] += 1
        self.drops_by_pipeline.setdefault(pipeline, Counter())[reason] += 1

    def add_kept(self, pipeline: str, seconds: float) -> None:
        self.candidates[pipeline] += 1
        self.covered[pipeline] += 1
        self.kept[pipeline] += 1
        self.kept_seconds += seconds

    def yield_of(self, pipeline: str | None = None) -> float:
        """Kept / candidates that have a covering test."""
        cov = self.covered[pipeline] if pipeline else sum(self.covered.values())
        kept = self.kept[pipeline] if pipeline else sum(self.kept.values())
        return kept / cov if cov else 0.0

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict() mangles Counters
        for k in ("candidates", "covered", "kept", "drops"):
            d[k] = dict(d[k])
        d["drops_by_pipeline"] = {k: dict(v) for k, v in self.drops_by_pipeline.items()}
        d["yield"] = {p: round(self.yield_of(p), 4) for p in self.candidates}
        d["yield_total"] = round(self.yield_of(), 4)
        kept = sum(self.kept.values())
        d["seconds_per_kept_task"] = round(self.wall_s / kept, 2) if kept else None
        d["tasks_per_minute"] = round(60 * kept / self.wall_s, 3) if self.wall_s else 0.0
        return d

    def render(self) -> str:
        kept = sum(self.kept.values())
        lines = [
            f"repo2env yield report: {self.repo}",
            f"  bootstrap {self.bootstrap_s:.1f} s, baseline {self.baseline_s:.1f} s: {self.tests} tests, "
            f"{self.stable_passing} stable passes, {self.flaky_tests} flaky (never used)",
            f"  {'pipeline':<20}{'tried':>7}{'covered':>9}{'kept':>6}{'yield':>8}",
        ]
        for p in sorted(self.candidates):
            lines.append(
                f"  {p:<20}{self.candidates[p]:>7}{self.covered[p]:>9}{self.kept[p]:>6}"
                f"{100 * self.yield_of(p):>7.0f}%"
            )
        lines.append(
            f"  {'total':<20}{sum(self.candidates.values()):>7}{sum(self.covered.values()):>9}{kept:>6}"
            f"{100 * self.yield_of():>7.0f}%"
        )
        if self.drops:
            lines.append(
                "  drops: " + ", ".join(f"{r.replace('_', ' ')} {n}" for r, n in self.drops.most_common())
            )
        if self.sandbox.get("missing"):
            lines.append("  sandbox lacked: " + "; ".join(self.sandbox["missing"]))
        if self.result_warnings:
            lines.append(f"  test results refused ({len(self.result_warnings)}): {self.result_warnings[0]}")
        if kept:
            lines.append(
                f"  {self.wall_s / kept:.1f} s wall per kept task ({60 * kept / self.wall_s:.2f} tasks/min), "
                f"{self.kept_seconds / kept:.1f} s validation each"
            )
        return "\n".join(lines)
