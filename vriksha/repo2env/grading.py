"""Run a task's hidden fail-to-pass and pass-to-pass tests against a tree: the oracle, the empty check, a submission."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vriksha.repo2env.layout import is_test_file
from vriksha.repo2env.task import TaskFiles
from vriksha.repo2env.testrun import PASS, TestRun, run_tests

logger = logging.getLogger(__name__)

__all__ = ["Verdict", "verify", "materialize", "verdict_of", "protect", "copy_workspace"]

_NOT_SUBMITTED = {"__pycache__", ".pytest_cache", ".git"}


@dataclass(slots=True)
class Verdict:
    f2p_passed: list[str] = field(default_factory=list)
    f2p_failed: list[str] = field(default_factory=list)
    p2p_passed: list[str] = field(default_factory=list)
    p2p_failed: list[str] = field(default_factory=list)
    timed_out: bool = False
    duration_s: float = 0.0
    output: str = ""

    @property
    def f2p_rate(self) -> float:
        n = len(self.f2p_passed) + len(self.f2p_failed)
        return len(self.f2p_passed) / n if n else 0.0

    @property
    def p2p_rate(self) -> float:
        n = len(self.p2p_passed) + len(self.p2p_failed)
        return len(self.p2p_passed) / n if n else 0.0

    @property
    def resolved(self) -> bool:
        return not self.f2p_failed and not self.p2p_failed and bool(self.f2p_passed) and not self.timed_out

    def summary(self) -> dict:
        return {
            "f2p_passed": len(self.f2p_passed),
            "f2p_failed": len(self.f2p_failed),
            "p2p_passed": len(self.p2p_passed),
            "p2p_failed": len(self.p2p_failed),
            "timed_out": self.timed_out,
        }


def materialize(dest: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = (dest / rel).resolve()
        if not path.is_relative_to(dest.resolve()):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _copy_link(path: str, target: Path, root: str) -> bool:
    """Recreate the link at `path` as `target` when it is relative and resolves inside `root`."""
    dest = os.readlink(path)
    if os.path.isabs(dest) or not _inside(os.path.realpath(path), root):
        return False
    os.symlink(dest, target)
    return True


def _copy_file(path: str, target: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src, target.open("wb") as out:
        shutil.copyfileobj(src, out)


def copy_workspace(src: Path, dst: Path) -> list[str]:
    """Copy a submitted tree into `dst` without following any symlink; returns what was left out.

    Regular files and directories are copied; a relative link that resolves inside the workspace is
    recreated as it is; a link pointing out of it (or absolute), and anything not a file (a fifo, a
    socket), is left out: the copy runs on the host, and a link followed here would read whatever
    it names (a root-only file, another task's workspace) into the tree the tests see.
    """
    root = os.path.realpath(src)
    dropped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(src):  # never descends into a linked directory
        here = dst / os.path.relpath(dirpath, src)
        here.mkdir(parents=True, exist_ok=True)
        dirnames[:] = [d for d in dirnames if d not in _NOT_SUBMITTED]
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                if name in dirnames:
                    dirnames.remove(name)
                if not _copy_link(path, here / name, root):
                    dropped.append(f"{rel} (a link to {os.readlink(path)}, outside the workspace)")
            elif stat.S_ISREG(mode):
                _copy_file(path, here / name)
            elif not stat.S_ISDIR(mode):
                dropped.append(f"{rel} (not a regular file)")
    return dropped


PYTEST_CONFIG = {"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}
STARTUP_HOOKS = {"conftest.py", "sitecustomize.py", "usercustomize.py"}


def protect(tree: Path, task: TaskFiles) -> None:
    """Undo what a submission may not change: test files, pytest configuration, startup hooks.

    The task's own test files and pytest config files are laid back over the submitted tree, and
    conftest/sitecustomize/usercustomize files that the task did not ship are removed: a submission
    changes library code, not the judge.
    """
    for rel, data in task.workspace.items():
        if is_test_file(rel) or Path(rel).name in PYTEST_CONFIG:
            materialize(tree, {rel: data})
    for path in tree.rglob("*.py"):
        rel = path.relative_to(tree).as_posix()
        if path.name in STARTUP_HOOKS and rel not in task.workspace and rel not in task.hidden:
            path.unlink()


def verdict_of(run: TestRun, f2p: list[str], p2p: list[str]) -> Verdict:
    ok = {nid for nid, r in run.results.items() if r.outcome in PASS}
    return Verdict(
        f2p_passed=[t for t in f2p if t in ok],
        f2p_failed=[t for t in f2p if t not in ok],
        p2p_passed=[t for t in p2p if t in ok],
        p2p_failed=[t for t in p2p if t not in ok],
        timed_out=run.timed_out,
        duration_s=run.duration_s,
        output=run.output,
    )


def verify(
    task: TaskFiles,
    venv: Path,
    workspace: Path | None = None,
    *,
    solution: bool = False,
) -> Verdict:
    """Copy `workspace` (default: the task's own), add the hidden tests (and the solution), run F2P + P2P."""
    meta = task.meta
    tree = Path(tempfile.mkdtemp(prefix="vriksha-r2e-verify-"))
    dropped: list[str] = []
    try:
        if workspace is None:
            materialize(tree, task.workspace)
        else:
            dropped = copy_workspace(workspace, tree)
            for item in dropped:
                logger.warning("task %s: left out of the submission: %s", meta.id, item)
            protect(tree, task)
        materialize(tree, task.hidden)  # hidden tests always win over whatever the workspace has there
        if solution:
            materialize(tree, task.solution)
            for rel in task.deleted:
                (tree / rel).unlink(missing_ok=True)
        select = [*meta.fail_to_pass, *meta.pass_to_pass]
        run = run_tests(  # always inside the sandbox
            venv / "bin" / "python",
            tree,
            select=select,
            timeout_s=meta.timeout_s,
            extra_args=meta.pytest_extra_args,
        )
        verdict = verdict_of(run, meta.fail_to_pass, meta.pass_to_pass)
        if dropped:
            verdict.output = "left out of the submission: " + "; ".join(dropped) + "\n" + verdict.output
        return verdict
    finally:
        shutil.rmtree(tree, ignore_errors=True)
