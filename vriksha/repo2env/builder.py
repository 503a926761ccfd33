"""The whole flow: source -> venv -> baseline -> candidates -> validated tasks -> dataset + yield report.

The bootstrap (installing the declared dependencies) is its own step, with network; every run of the
repository's tests after it (baseline, candidate validation, the empty check and the oracle) runs
inside the sandbox: network cut, only its own copy of the tree and the venv (read-only) visible."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from tqdm import tqdm

from vriksha.envs.sandbox import require_sandbox
from vriksha.repo2env.archive import UnpackLimits
from vriksha.repo2env.baseline import run_baseline
from vriksha.repo2env.bootstrap import Venv, bootstrap, cache_root
from vriksha.repo2env.build_config import DEFAULT_PIPELINES, BuildConfig
from vriksha.repo2env.candidate_check import Outcome, validate_candidate
from vriksha.repo2env.errors import Repo2EnvError
from vriksha.repo2env.pipelines import PIPELINES, BuildContext, Candidate, Pipeline
from vriksha.repo2env.report import YieldReport
from vriksha.repo2env.source import prepare_source
from vriksha.repo2env.task import DatasetManifest, write_manifest, write_task

logger = logging.getLogger(__name__)

__all__ = ["BuildConfig", "build_dataset", "DEFAULT_PIPELINES"]


def _round_robin(iters: list[tuple[Pipeline, Iterator[Candidate]]]) -> Iterator[tuple[Pipeline, Candidate]]:
    live = list(iters)
    while live:
        for item in list(live):
            pipe, it = item
            try:
                yield pipe, next(it)
            except StopIteration:
                live.remove(item)


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").exists():
        raise Repo2EnvError(
            f"{out} exists, is not empty and holds no manifest.json; pick an empty or new --out"
        )
    shutil.rmtree(out / "tasks", ignore_errors=True)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    (out / "venvs").mkdir(exist_ok=True)


def build_dataset(
    source: str | Path, out: Path, cfg: BuildConfig | None = None
) -> tuple[YieldReport, DatasetManifest]:
    cfg = cfg or BuildConfig()
    unknown = [p for p in cfg.pipelines if p not in PIPELINES]
    if unknown:
        raise Repo2EnvError(f"unknown pipeline(s) {unknown}; choose from {sorted(PIPELINES)}")
    wall = time.monotonic()
    out = Path(out)
    _prepare_out(out)
    work = cache_root() / "sources"
    work.mkdir(parents=True, exist_ok=True)
    project = prepare_source(source, work, UnpackLimits.from_mb(cfg.max_unpacked_mb, cfg.max_unpacked_files))
    report = YieldReport(repo=project.name)
    t0 = time.monotonic()
    venv: Venv = bootstrap(project.root, project.content_hash, project.name)
    report.bootstrap_s = time.monotonic() - t0
    (out / "venvs" / f"{venv.key}.json").write_text(json.dumps(venv.to_json(), indent=1))
    # every run of the repository's code below is sandboxed: fail now, loudly, if the sandbox cannot run
    check = require_sandbox(what=f"{project.name}'s tests")
    report.sandbox = {"isolation": check.isolation, "missing": check.missing}
    base = run_baseline(venv.python, project.root, runs=cfg.baseline_runs, timeout_s=cfg.timeout_s)
    report.baseline_s = base.seconds
    report.tests = len(base.durations)
    report.stable_passing = len(base.stable_pass)
    report.flaky_tests = len(base.flaky)
    report.result_warnings = list(base.warnings)
    ctx = BuildContext(
        project=project, python=venv.python, baseline=base, seed=cfg.seed, per_function=cfg.per_function
    )
    pipes = [PIPELINES[name]() for name in cfg.pipelines]
    manifest = DatasetManifest(source=project.origin, repo=project.name)
    stream = _round_robin([(p, iter(_shuffled(p, ctx))) for p in pipes])
    bar = tqdm(desc=f"repo2env {project.name}", unit="cand", disable=not cfg.progress, dynamic_ncols=True)
    kept = tried = 0
    try:
        with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
            running: dict[Future, tuple[Pipeline, Candidate]] = {}
            exhausted = False
            while True:
                while (
                    not exhausted
                    and len(running) < max(1, cfg.workers)
                    and kept < cfg.max_tasks
                    and (cfg.max_candidates is None or tried < cfg.max_candidates)
                ):
                    nxt = next(stream, None)
                    if nxt is None:
                        exhausted = True
                        break
                    tried += 1
                    pipe, cand = nxt
                    running[pool.submit(validate_candidate, cand, pipe, project, venv, base)] = (pipe, cand)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    pipe, cand = running.pop(fut)
                    outcome: Outcome = fut.result()
                    bar.update(1)
                    if outcome.task is not None and kept < cfg.max_tasks:
                        kept += 1
                        report.add_kept(pipe.name, outcome.seconds)
                        manifest.tasks.append(write_task(out, outcome.task))
                        logger.info("kept %s (%s)", outcome.task.meta.id, cand.target)
                    elif outcome.drop is not None:
                        report.add_drop(pipe.name, outcome.drop.reason, outcome.drop.covered)
                        logger.info(
                            "dropped %s: %s %s", cand.target, outcome.drop.reason, outcome.drop.detail
                        )
                    bar.set_postfix(kept=kept)
    finally:
        bar.close()
        for p in pipes:
            close = getattr(p, "close", None)
            if close:
                close()
    report.wall_s = time.monotonic() - wall
    manifest.report = report.to_dict()
    write_manifest(out, manifest)
    return report, manifest


def _shuffled(pipe: Pipeline, ctx: BuildContext) -> Iterator[Candidate]:
    if pipe.name == "commit":  # history order; each candidate costs a baseline run, so stay lazy
        yield from pipe.candidates(ctx)
        return
    cands = list(pipe.candidates(ctx))
    ctx.rng(pipe.name).shuffle(cands)
    yield from cands
