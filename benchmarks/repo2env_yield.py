"""Repo2Env yield on real projects: candidates, yield per pipeline, tasks per minute, re-validation share.

    python benchmarks/repo2env_yield.py [--projects inflection==0.5.1 cachetools==5.5.0 toolz==1.0.0]
                                        [--max-tasks 8] [--workers 2] [--json out.json]

Each project's sdist comes from the package index. After the build, every kept task is re-validated
in a second, independent run (oracle must score 1.0, the untouched workspace 0, with the same
fail-to-pass/pass-to-pass outcomes) and searched for leaks (its solution's removed lines in the workspace,
hidden test files, .git, bytecode, egg-info).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from vriksha.repo2env.builder import BuildConfig, build_dataset
from vriksha.repo2env.candidate_check import find_leaks, solution_windows
from vriksha.repo2env.dataset import Dataset
from vriksha.repo2env.dataset_check import validate_dataset

DEFAULT_PROJECTS = ["inflection==0.5.1", "cachetools==5.5.0", "toolz==1.0.0"]


def _leaks(ds: Dataset) -> int:
    """Tasks whose workspace holds litter, a hidden test file, or the solution's changed code with its
    context (the same rule the build applies)."""
    n = 0
    for tid in ds.task_ids:
        task = ds.task(tid)
        secrets = []
        for rel, data in task.solution.items():
            secrets += solution_windows(
                data.decode("utf-8", "replace"), task.workspace.get(rel, b"").decode("utf-8", "replace")
            )
        n += bool(find_leaks(task.workspace, secrets, task.hidden))
    return n


def run_project(spec: str, out: Path, args: argparse.Namespace) -> dict:
    cfg = BuildConfig(
        pipelines=tuple(args.pipelines),
        max_tasks=args.max_tasks,
        max_candidates=args.max_candidates,
        workers=args.workers,
        seed=args.seed,
        progress=not args.no_progress,
    )
    report, manifest = build_dataset(spec, out, cfg)
    print(report.render(), file=sys.stderr)
    t0 = time.monotonic()
    checks = validate_dataset(out, progress=False)
    revalidate_s = time.monotonic() - t0
    ds = Dataset(out)
    same = sum(c.ok and c.oracle["f2p_passed"] == len(ds.task(c.task_id).meta.fail_to_pass) for c in checks)
    d = report.to_dict()
    return {
        "project": spec,
        "tests": d["tests"],
        "flaky_tests": d["flaky_tests"],
        "candidates": d["candidates"],
        "covered": d["covered"],
        "kept": d["kept"],
        "drops": d["drops"],
        "yield_per_pipeline": d["yield"],
        "yield_total": d["yield_total"],
        "tasks_per_minute": d["tasks_per_minute"],
        "wall_s": round(report.wall_s, 1),
        "bootstrap_s": round(report.bootstrap_s, 1),
        "baseline_s": round(report.baseline_s, 1),
        "revalidated_identically": f"{same}/{len(checks)}",
        "revalidation_share": round(same / len(checks), 3) if checks else None,
        "revalidate_s": round(revalidate_s, 1),
        "tasks_with_leaks": _leaks(ds),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--projects", nargs="+", default=DEFAULT_PROJECTS, help="NAME==VERSION sdists from the index"
    )
    ap.add_argument("--pipelines", nargs="+", default=["implement_function", "fix_bug"])
    ap.add_argument("--max-tasks", type=int, default=8, help="tasks kept per project")
    ap.add_argument("--max-candidates", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--keep", type=Path, help="keep the datasets under this directory")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base = args.keep or Path(tempfile.mkdtemp(prefix="repo2env-bench-"))
    rows = []
    for spec in args.projects:
        rows.append(run_project(spec, base / spec.replace("==", "-"), args))
        print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{'project':<22}{'cands':>6}{'covered':>8}{'kept':>5}{'yield':>7}{'tasks/min':>10}{'reval':>8}{'leaks':>6}"
    )
    for r in rows:
        print(
            f"{r['project']:<22}{sum(r['candidates'].values()):>6}{sum(r['covered'].values()):>8}"
            f"{sum(r['kept'].values()):>5}{100 * r['yield_total']:>6.0f}%{r['tasks_per_minute']:>10.2f}"
            f"{r['revalidated_identically']:>8}{r['tasks_with_leaks']:>6}"
        )
        print(
            "    yield per pipeline: "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["yield_per_pipeline"].items())
            + "; drops: "
            + ", ".join(f"{k} {v}" for k, v in r["drops"].items())
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
