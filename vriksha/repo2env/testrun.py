"""Run a project's pytest suite in its venv, inside the sandbox, and record each test's outcome, duration
and failure text.

A tiny plugin (`_plugin/vriksha_r2e_plugin.py`, loaded with `-p`) writes the results as JSON,
selects tests by node id, and optionally records which project functions each test calls.
Runs leave no litter in the tree: no bytecode, no `.pytest_cache`.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["TestResult", "TestRun", "run_tests", "pytest_args", "test_env", "PLUGIN_DIR", "PASS", "FAIL"]

PLUGIN_DIR = Path(__file__).resolve().parent / "_plugin"
PASS = {"passed"}
FAIL = {"failed", "error"}
OUTCOMES = {"passed", "failed", "error", "skipped", "xfailed", "xpassed", "collection_error"}


@dataclass(slots=True)
class TestResult:
    outcome: str  # passed | failed | error | skipped | xfailed | xpassed | collection_error
    duration: float = 0.0
    message: str = ""


@dataclass(slots=True)
class TestRun:
    results: dict[str, TestResult] = field(default_factory=dict)
    exit_code: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    output: str = ""
    coverage: dict[str, list[str]] = field(default_factory=dict)
    isolation: dict[str, bool] = field(default_factory=dict)  # what the sandbox isolated in this run
    missing: list[str] = field(default_factory=list)  # the protections it lacked
    warnings: list[str] = field(default_factory=list)  # results refused as forged or malformed

    def with_outcome(self, outcomes: set[str]) -> set[str]:
        return {nid for nid, r in self.results.items() if r.outcome in outcomes}

    @property
    def passed(self) -> set[str]:
        return self.with_outcome(PASS)

    @property
    def failed(self) -> set[str]:
        return self.with_outcome(FAIL)

    @property
    def collection_errors(self) -> dict[str, str]:
        return {nid: r.message for nid, r in self.results.items() if r.outcome == "collection_error"}


def source_roots(workspace: Path) -> list[Path]:
    """What goes on PYTHONPATH: `src/` for a src layout, then the tree itself."""
    roots = []
    src = workspace / "src"
    if src.is_dir() and any(p.suffix == ".py" or (p / "__init__.py").exists() for p in src.iterdir()):
        roots.append(src)
    roots.append(workspace)
    return roots


def pytest_args(paths: Iterable[str] = (), extra: Iterable[str] = ()) -> list[str]:
    return [
        "-m",
        "pytest",
        "-p",
        "vriksha_r2e_plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-q",
        "--tb=short",
        "-rN",
        "--color=no",
        *extra,
        *paths,
    ]


def test_env(
    workspace: Path, out: Path | None, select: Path | None, trace: Path | None, plugin_dir: Path
) -> dict[str, str]:
    env = {
        "PYTHONPATH": os.pathsep.join([str(plugin_dir), *(str(p) for p in source_roots(workspace))]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    if out is not None:
        env["VRIKSHA_R2E_OUT"] = str(out)
    if select is not None:
        env["VRIKSHA_R2E_SELECT"] = str(select)
    if trace is not None:
        env["VRIKSHA_R2E_TRACE"] = str(trace).rstrip("/") + "/"
    return env


def parse_results(payload: dict) -> tuple[dict[str, TestResult], dict[str, list[str]]]:
    results = {
        nid: TestResult(r["outcome"], float(r.get("duration", 0.0)), r.get("message", ""))
        for nid, r in payload.get("tests", {}).items()
    }
    return results, payload.get("coverage", {})


def _files_of(select: Iterable[str]) -> list[str]:
    return sorted({nid.split("::", 1)[0] for nid in select})


def _checked(
    payload: object, select: list[str] | None, exit_code: int | None
) -> tuple[dict[str, TestResult], dict[str, list[str]], list[str]]:
    """Parse the plugin's results, refusing what a forged file would show: bad records, tests that were
    not selected, or passes only where pytest itself reported failures."""
    if not isinstance(payload, dict) or not isinstance(payload.get("tests", {}), dict):
        return {}, {}, ["the results file is not what the plugin writes: ignored"]
    warnings: list[str] = []
    results: dict[str, TestResult] = {}
    for nid, r in payload.get("tests", {}).items():
        if not isinstance(r, dict) or r.get("outcome") not in OUTCOMES:
            warnings.append(f"{str(nid)[:200]}: a malformed result record: ignored")
            continue
        if select is not None and nid not in select and r["outcome"] != "collection_error":
            warnings.append(f"{str(nid)[:200]}: reported but not selected: ignored")
            continue
        try:
            results[nid] = TestResult(r["outcome"], float(r.get("duration", 0.0)), str(r.get("message", "")))
        except (TypeError, ValueError):
            warnings.append(f"{str(nid)[:200]}: a malformed result record: ignored")
    if exit_code == 1 and results and not any(r.outcome in FAIL for r in results.values()):
        warnings.append("pytest reported failures but the results file claims none: results discarded")
        results = {}
    cov = payload.get("coverage", {})
    return results, cov if isinstance(cov, dict) else {}, warnings


def run_tests(
    python: Path,
    workspace: Path,
    *,
    select: Iterable[str] | None = None,
    paths: Iterable[str] | None = None,
    trace: bool = False,
    timeout_s: float = 600.0,
    extra_args: Iterable[str] = (),
    memory_mb: int = 4096,
) -> TestRun:
    """Run pytest on a copy of `workspace` with the venv's `python`, inside the sandbox.

    The repository's code runs only there: network cut, a private root holding the copy (writable),
    the venv and the interpreter (read-only) and nothing else; no other dataset, no hidden tests of
    other tasks, no host process is visible. `select`: only these node ids (their files are passed to
    pytest, the rest deselected). `trace`: record which functions of the tree each test calls.
    """
    from vriksha.envs.sandbox import read_output, run_sandboxed

    workspace = workspace.resolve()
    venv = Path(python).parent.parent
    work = Path(tempfile.mkdtemp(prefix="vriksha-r2e-run-"))
    try:
        ws = work / "ws"
        shutil.copytree(
            workspace, ws, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
        )
        shutil.copytree(PLUGIN_DIR, work / ".plugin", ignore=shutil.ignore_patterns("__pycache__"))
        out = work / ".out.json"
        select_file = None
        args = list(paths or [])
        if select is not None:
            select = list(select)
            select_file = work / ".select.txt"
            select_file.write_text("\n".join(select) + "\n")
            args = _files_of(select) or ["--co"]
        env = test_env(ws, out, select_file, ws if trace else None, work / ".plugin")
        cmd = shlex.join([str(venv / "bin" / "python"), *pytest_args(args, extra_args)])
        res = run_sandboxed(
            ["/bin/sh", "-c", f"cd ws && exec {cmd}"],
            cwd=work,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_procs=64,
            max_file_mb=64,
            env=env,
            ro_paths=[venv],
        )
        run = TestRun(
            exit_code=res.exit_code,
            duration_s=res.duration_s,
            timed_out=res.timed_out,
            output=(res.stdout + res.stderr)[-20000:],
            isolation=res.isolation,
            missing=res.missing,
        )
        data = read_output(work, out.name)  # never through a link the tests put in its place
        if data is not None:
            try:
                payload = json.loads(data.decode("utf-8", "replace"))
            except json.JSONDecodeError:
                payload = None
            run.results, run.coverage, run.warnings = _checked(payload, select, res.exit_code)
        for w in run.warnings[:5]:
            logger.warning("test run in %s: %s", workspace.name, w)
        return run
    finally:
        shutil.rmtree(work, ignore_errors=True)
