"""The baseline: run the suite more than once, mark flaky tests, keep the stable passes and the coverage map."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from vriksha.repo2env.errors import BootstrapError
from vriksha.repo2env.testrun import TestRun, run_tests

logger = logging.getLogger(__name__)

__all__ = ["Baseline", "run_baseline"]


@dataclass(slots=True)
class Baseline:
    outcomes: list[dict[str, str]]  # per run: node id -> outcome
    stable_pass: set[str]
    flaky: set[str]
    durations: dict[str, float]
    coverage: dict[str, list[str]]  # node id -> "relpath::qualname" of the project functions it called
    seconds: float
    extra_args: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # results the runs refused (forged or malformed)

    def tests_reaching(self, key: str) -> set[str]:
        return {nid for nid, funcs in self.coverage.items() if key in funcs}

    def timeout_for(self, tests: set[str] | None = None, floor: float = 30.0) -> float:
        total = sum(self.durations.get(t, 0.0) for t in (tests if tests is not None else self.durations))
        return max(floor, 5 * total + 20)


def flaky_between(runs: list[TestRun]) -> set[str]:
    ids = set().union(*(r.results for r in runs))
    flaky = set()
    for nid in ids:
        seen = {r.results[nid].outcome if nid in r.results else "missing" for r in runs}
        if len(seen) > 1:
            flaky.add(nid)
    return flaky


def run_baseline(python: Path, root: Path, *, runs: int = 2, timeout_s: float = 900.0) -> Baseline:
    """Run the whole suite `runs` (>= 2) times, the first with the coverage tracer on."""
    if runs < 2:
        raise BootstrapError("the baseline needs at least two runs to tell flaky tests; pass runs >= 2")
    extra: list[str] = []
    first = run_tests(python, root, trace=True, timeout_s=timeout_s)
    if not first.results and first.exit_code in (
        3,
        4,
    ):  # internal or usage error, often addopts for absent plugins
        extra = ["-o", "addopts="]
        first = run_tests(python, root, trace=True, timeout_s=timeout_s, extra_args=extra)
    if first.timed_out:
        raise BootstrapError(
            f"the test suite took more than {timeout_s:.0f} s; raise --timeout or pick a smaller project"
        )
    if not first.passed and first.warnings:
        raise BootstrapError(
            f"the baseline run's results were refused ({'; '.join(first.warnings[:3])}): the repository's "
            "code may be forging them; nothing can be built from it"
        )
    if not first.passed:
        raise BootstrapError(
            f"no test passes in the baseline run (pytest exit code {first.exit_code}); the suite may need "
            f"services or data this machine lacks. Last output:\n{first.output[-1500:]}"
        )
    all_runs = [first]
    for _ in range(runs - 1):
        all_runs.append(run_tests(python, root, timeout_s=timeout_s, extra_args=extra))
    flaky = flaky_between(all_runs)
    stable = set.intersection(*(r.passed for r in all_runs)) - flaky
    durations: dict[str, float] = {}
    for r in all_runs:
        for nid, res in r.results.items():
            durations[nid] = max(durations.get(nid, 0.0), res.duration)
    if flaky:
        logger.info("baseline: %d flaky test(s) excluded: %s", len(flaky), sorted(flaky)[:5])
    return Baseline(
        outcomes=[{nid: res.outcome for nid, res in r.results.items()} for r in all_runs],
        stable_pass=stable,
        flaky=flaky,
        durations=durations,
        coverage=first.coverage,
        seconds=sum(r.duration_s for r in all_runs),
        extra_args=extra,
        warnings=sorted({w for r in all_runs for w in r.warnings}),
    )
