"""Run a project's pytest suite in its venv and record each test's outcome, duration and failure text.

A tiny plugin (`_plugin/vriksha_r2e_plugin.py`, loaded with `-p`) writes the results as JSON,
selects tests by node id, and optionally records which project functions each test calls.
Runs leave no litter in the tree: no bytecode, no `.pytest_cache`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["TestResult", "TestRun", "run_tests", "pytest_args", "test_env", "PLUGIN_DIR", "PASS", "FAIL"]

PLUGIN_DIR = Path(__file__).resolve().parent / "_plugin"
PASS = {"passed"}
FAIL = {"failed", "error"}


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


def run_tests(
    python: Path,
    workspace: Path,
    *,
    select: Iterable[str] | None = None,
    paths: Iterable[str] | None = None,
    trace: bool = False,
    timeout_s: float = 600.0,
    extra_args: Iterable[str] = (),
) -> TestRun:
    """Run pytest in `workspace` with the venv's `python` (a plain subprocess: the builder's own runs).

    `select`: only these node ids (their files are passed to pytest, the rest deselected).
    `trace`: record which functions under `workspace` each test calls.
    """
    workspace = workspace.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="vriksha-r2e-run-"))
    try:
        out = scratch / "results.json"
        select_file = None
        args = list(paths or [])
        if select is not None:
            select = list(select)
            select_file = scratch / "select.txt"
            select_file.write_text("\n".join(select) + "\n")
            args = _files_of(select) or ["--co"]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            **test_env(workspace, out, select_file, workspace if trace else None, PLUGIN_DIR),
        }
        cmd = [str(python), *pytest_args(args, extra_args)]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=workspace,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            output, _ = proc.communicate()
        run = TestRun(
            exit_code=proc.returncode,
            duration_s=time.monotonic() - start,
            timed_out=timed_out,
            output=output.decode("utf-8", "replace")[-20000:],
        )
        if out.is_file():
            run.results, run.coverage = parse_results(json.loads(out.read_text()))
        return run
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
