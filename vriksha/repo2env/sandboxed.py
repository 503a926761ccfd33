"""Run a tree's tests inside `vriksha.envs.sandbox` (agent-written code): a private copy of the tree and venv."""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from vriksha.envs.sandbox import run_sandboxed
from vriksha.profiling import phase
from vriksha.repo2env.bootstrap import copy_venv
from vriksha.repo2env.testrun import PLUGIN_DIR, TestRun, parse_results, pytest_args, test_env

__all__ = ["run_tests_sandboxed"]


def run_tests_sandboxed(
    venv: Path,
    tree: Path,
    *,
    select: Iterable[str] | None = None,
    paths: Iterable[str] = (),
    timeout_s: float = 120.0,
    extra_args: Iterable[str] = (),
    memory_mb: int = 4096,
) -> TestRun:
    """Copy `tree` and `venv` into a fresh sandbox directory and run pytest there, network off."""
    work = Path(tempfile.mkdtemp(prefix="vriksha-r2e-sbx-"))
    try:
        ws = work / "ws"
        shutil.copytree(
            tree, ws, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
        )
        copy_venv(venv, work / ".venv")
        shutil.copytree(PLUGIN_DIR, work / ".plugin", ignore=shutil.ignore_patterns("__pycache__"))
        select_file = None
        args = list(paths)
        if select is not None:
            select = list(select)
            select_file = work / ".select.txt"
            select_file.write_text("\n".join(select) + "\n")
            args = sorted({nid.split("::", 1)[0] for nid in select}) or ["--co"]
        out = work / ".out.json"
        env = test_env(ws, out, select_file, None, work / ".plugin")
        pytest_cmd = shlex.join(["../.venv/bin/python", *pytest_args(args, extra_args)])
        with phase("env.sandbox"):
            res = run_sandboxed(
                ["/bin/sh", "-c", f"cd ws && exec {pytest_cmd}"],
                cwd=work,
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                max_procs=64,
                max_file_mb=64,
                env=env,
            )
        run = TestRun(
            exit_code=res.exit_code,
            duration_s=res.duration_s,
            timed_out=res.timed_out,
            output=(res.stdout + res.stderr)[-20000:],
        )
        if out.is_file():
            try:
                run.results, _ = parse_results(json.loads(out.read_text()))
            except json.JSONDecodeError:
                pass
        return run
    finally:
        shutil.rmtree(work, ignore_errors=True)
