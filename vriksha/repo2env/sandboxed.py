"""`run_tests_sandboxed(venv, tree, ...)`: `run_tests` by venv directory (every test run is sandboxed)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from vriksha.repo2env.testrun import TestRun, run_tests

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
    """Run pytest on a copy of `tree` with the venv at `venv`, inside the sandbox, network off."""
    return run_tests(
        Path(venv) / "bin" / "python",
        tree,
        select=select,
        paths=list(paths),
        timeout_s=timeout_s,
        extra_args=extra_args,
        memory_mb=memory_mb,
    )
