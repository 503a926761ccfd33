"""Validate one candidate: find its fail-to-pass and pass-to-pass tests, cut the workspace, run the empty
check and the oracle. A candidate becomes a task only when every check holds; otherwise it is dropped
with a reason."""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from vriksha.repo2env.bootstrap import Venv
from vriksha.repo2env.grading import verify
from vriksha.repo2env.layout import file_of, is_source_file, is_test_file
from vriksha.repo2env.pipelines.base import Candidate, Pipeline
from vriksha.repo2env.source import Project, copy_tree, iter_files
from vriksha.repo2env.task import TaskFiles, TaskMeta
from vriksha.repo2env.testrun import run_tests

logger = logging.getLogger(__name__)

__all__ = ["Drop", "DROP_REASONS", "validate_candidate", "find_leaks", "solution_windows"]

DROP_REASONS = (
    "no_covering_test",
    "no_fail_to_pass",
    "no_pass_to_pass",
    "broke_pass_to_pass",
    "flaky",
    "timeout",
    "leak",
    "error",
)


@dataclass(slots=True)
class Drop:
    reason: str
    detail: str = ""
    seconds: float = 0.0
    covered: bool = True


@dataclass(slots=True)
class Outcome:
    task: TaskFiles | None = None
    drop: Drop | None = None
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


def _norm(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def find_leaks(workspace: dict[str, bytes], secrets: list[str], hidden: dict[str, bytes]) -> list[str]:
    """Workspace files that hold a secret (normalised), a hidden test file, or tool litter."""
    leaks = []
    norm_secrets = [_norm(s) for s in secrets if _norm(s)]
    for rel, data in workspace.items():
        parts = Path(rel).parts
        if any(
            p in (".git", "__pycache__") or p.endswith((".egg-info", ".dist-info")) for p in parts
        ) or rel.endswith(".pyc"):
            leaks.append(f"{rel}: litter that may hold history or compiled code")
            continue
        if rel in hidden:
            leaks.append(f"{rel}: a hidden test file")
            continue
        text = _norm(data.decode("utf-8", "replace"))
        for s in norm_secrets:
            if s in text:
                leaks.append(f"{rel}: holds the removed code")
                break
    return leaks


def solution_windows(solution: str, broken: str, context: int = 2) -> list[str]:
    """The solution's changed lines with `context` lines around them: text that must not appear in the
    workspace (an untouched copy of the fixed code elsewhere would hand the agent the answer)."""
    sol, brk = solution.splitlines(), broken.splitlines()
    out = []
    for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(None, sol, brk, autojunk=False).get_opcodes():
        if tag != "equal" and i2 > i1:
            out.append("\n".join(sol[max(0, i1 - context) : i2 + context]))
    return out


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.as_posix(): (root / p).read_bytes() for p in iter_files(root)}


class _Dropped(Exception):
    """The candidate fails a check: why (a drop reason) and the detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def validate_candidate(
    cand: Candidate, pipeline: Pipeline, project: Project, venv: Venv, baseline
) -> Outcome:
    start = time.monotonic()
    base_line = cand.baseline or baseline

    def drop(reason: str, detail: str = "", covered: bool = True) -> Outcome:
        return Outcome(
            drop=Drop(reason, detail, time.monotonic() - start, covered), seconds=time.monotonic() - start
        )

    covering = {t for t in cand.covering if is_test_file(file_of(t))} or set(cand.covering)
    if not covering:
        if cand.covering_any & base_line.flaky:
            return drop("flaky", "every test reaching the target is flaky")
        return drop("no_covering_test", covered=False)
    timings: dict[str, float] = {}
    broken_dir = Path(tempfile.mkdtemp(prefix="vriksha-r2e-broken-"))
    try:
        task = _broken_task(cand, pipeline, project, venv, base_line, covering, broken_dir, timings)
        _check_task(task, venv, timings)
        timings["total_s"] = time.monotonic() - start
        task.meta.timings = timings
        return Outcome(task=task, seconds=timings["total_s"], timings=timings)
    except _Dropped as dropped:
        return drop(dropped.reason, dropped.detail)
    except Exception as exc:  # one candidate's failure must not stop the build
        logger.exception("candidate %s failed", cand.target)
        return drop("error", f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(broken_dir, ignore_errors=True)


def _write_broken(base: Path, broken_dir: Path, cand: Candidate) -> None:
    copy_tree(base, broken_dir)
    for rel, text in cand.broken.items():
        path = broken_dir / rel
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def _broken_task(
    cand: Candidate,
    pipeline: Pipeline,
    project: Project,
    venv: Venv,
    base_line,
    covering: set[str],
    broken_dir: Path,
    timings: dict[str, float],
) -> TaskFiles:
    """Run the covering tests on the broken tree and cut the task: its fail-to-pass and pass-to-pass tests,
    workspace, hidden tests and solution. Raises `_Dropped` when the candidate cannot make a task."""
    base = cand.base or project.root
    _write_broken(base, broken_dir, cand)
    t0 = time.monotonic()
    timeout = base_line.timeout_for(covering)
    run = run_tests(
        venv.python,
        broken_dir,
        select=sorted(covering),
        timeout_s=timeout,
        extra_args=base_line.extra_args,
    )
    timings["broken_run_s"] = time.monotonic() - t0
    if run.timed_out:
        raise _Dropped("timeout", f"the covering tests ran past {timeout:.0f} s on the broken tree")
    f2p = sorted(t for t in covering if t in run.failed or t not in run.results)
    f2p = [t for t in f2p if is_test_file(file_of(t))]
    if not f2p:
        raise _Dropped("no_fail_to_pass", "no covering test fails on the broken tree")
    hidden_files = {file_of(t) for t in f2p} | {f for f in cand.hidden_extra if is_test_file(f)}
    excluded = {t for t in covering if t in run.failed or t not in run.results} - set(f2p)
    p2p = sorted(base_line.stable_pass - set(f2p) - excluded)
    if not p2p:
        raise _Dropped("no_pass_to_pass", "no test stays passing besides the fail-to-pass ones")
    tree = _read_tree(broken_dir)
    base_files = _read_tree(base)
    workspace = {rel: data for rel, data in tree.items() if rel not in hidden_files}
    hidden = {rel: base_files[rel] for rel in sorted(hidden_files) if rel in base_files}
    solution = {rel: text.encode() for rel, text in cand.solution.items() if text is not None}
    deleted = [rel for rel, text in cand.solution.items() if text is None]
    secrets = list(cand.secrets)
    for rel, text in cand.solution.items():
        if text is not None and cand.broken.get(rel) is not None:
            secrets += solution_windows(text, cand.broken[rel] or "")
    leaks = find_leaks(workspace, secrets, hidden)
    if leaks:
        raise _Dropped("leak", "; ".join(leaks[:3]))
    if pipeline.name == "implement_function":
        visible = {rel: d for rel, d in workspace.items() if is_source_file(rel) or is_test_file(rel)}
        cand.info["usage"] = _usage(visible, cand.info["name"], cand.info["file"])
    instruction = pipeline.instruction(cand, run, f2p)
    tid = f"{pipeline.name}-{hashlib.sha256((project.content_hash + cand.cid).encode()).hexdigest()[:12]}"
    meta = TaskMeta(
        id=tid,
        repo=project.name,
        repo_origin=project.origin,
        base_hash=project.content_hash if cand.base is None else cand.target,
        workspace_hash="",
        pipeline=pipeline.name,
        target=cand.target,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        hidden_files=sorted(hidden),
        solution_files=sorted(cand.solution),
        venv_key=venv.key,
        pytest_extra_args=base_line.extra_args,
        timeout_s=base_line.timeout_for(set(f2p) | set(p2p)),
    )
    return TaskFiles(
        meta=meta,
        instruction=instruction,
        workspace=workspace,
        hidden=hidden,
        solution=solution,
        deleted=deleted,
    )


def _check_task(task: TaskFiles, venv: Venv, timings: dict[str, float]) -> None:
    """The empty check (the untouched workspace fails every fail-to-pass test, passes every pass-to-pass one)
    and the oracle (the reference solution passes all). Raises `_Dropped` when either does not hold."""
    t0 = time.monotonic()
    empty = verify(task, venv.path)
    timings["empty_check_s"] = time.monotonic() - t0
    if empty.timed_out:
        raise _Dropped("timeout", "the hidden tests ran past their limit on the untouched workspace")
    if empty.p2p_failed:
        raise _Dropped(
            "broke_pass_to_pass",
            f"{len(empty.p2p_failed)} pass-to-pass test(s) fail on the workspace, e.g. {empty.p2p_failed[0]}",
        )
    if empty.f2p_passed:
        raise _Dropped("flaky", f"{empty.f2p_passed[0]} passed on the untouched workspace this time")
    t0 = time.monotonic()
    oracle = verify(task, venv.path, solution=True)
    timings["oracle_s"] = time.monotonic() - t0
    if oracle.timed_out:
        raise _Dropped("timeout", "the oracle ran past its limit")
    if not oracle.resolved:
        bad = (oracle.f2p_failed + oracle.p2p_failed)[:1]
        raise _Dropped("flaky", f"the reference solution does not pass {bad}")


def _usage(files: dict[str, bytes], name: str, own_file: str, limit: int = 4) -> list[str]:
    pattern = re.compile(rf"\b{re.escape(name)}\(")
    out: list[str] = []
    for rel in sorted(files):
        for line in files[rel].decode("utf-8", "replace").splitlines():
            s = line.strip()
            if pattern.search(s) and not s.startswith(("def ", "async def ", "#")) and rel != own_file:
                out.append(f"{s}    # {rel}")
                if len(out) >= limit:
                    return out
    return out
