"""commit: from git history, revert a commit's non-test change; its test change gives the fail-to-pass tests.

The workspace is the parent's tree minus the commit's changed test files (those are hidden); the
instruction is the commit message with the fix's identifiers stripped.
"""

from __future__ import annotations

import io
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vriksha.repo2env.baseline import run_baseline
from vriksha.repo2env.errors import BootstrapError
from vriksha.repo2env.layout import is_test_file
from vriksha.repo2env.pipelines.base import BuildContext, Candidate, Pipeline
from vriksha.repo2env.source import copy_tree
from vriksha.repo2env.testrun import TestRun

logger = logging.getLogger(__name__)

__all__ = ["CommitPipeline", "strip_identifiers"]

MAX_COMMITS = 30
MAX_CHANGED_FILES = 8


def _git(git_dir: Path, *args: str, binary: bool = False):
    proc = subprocess.run(["git", "-C", str(git_dir), *args], capture_output=True, timeout=120)
    if proc.returncode:
        raise BootstrapError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace')[-500:]}")
    return proc.stdout if binary else proc.stdout.decode("utf-8", "replace")


def _show(git_dir: Path, rev: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(git_dir), "show", f"{rev}:{path}"], capture_output=True, timeout=60
    )
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip_identifiers(message: str, diff_text: str) -> str:
    """Drop code spans, and identifiers that the fix's diff adds or removes, from a commit message."""
    changed: set[str] = set()
    defined: set[str] = set()
    for line in diff_text.splitlines():
        if line.startswith(("+++", "---", "diff ", "index ")):
            continue
        changed.update(_IDENT.findall(line.lstrip("+- ")))
        defined.update(re.findall(r"\b(?:def|class)\s+([A-Za-z_]\w*)", line))
    codey = {w for w in changed if "_" in w.strip("_") or any(c.isupper() for c in w[1:])} | defined
    out = re.sub(r"`[^`]+`", "`...`", message)
    out = re.sub(r"\b[\w.]+\(\)", "...", out)
    words = []
    for token in re.split(r"(\W+)", out):
        if token in codey:
            words.append("...")
        else:
            words.append(token)
    out = "".join(words)
    out = re.sub(r"(?i)\b(fix(es|ed)?|close[sd]?|resolve[sd]?)\s+#\d+", r"\1 an issue", out)
    out = re.sub(r"https?://\S+", "", out)
    return out.strip()


class CommitPipeline(Pipeline):
    name = "commit"

    def __init__(self, max_commits: int = MAX_COMMITS) -> None:
        self.max_commits = max_commits
        self._trees: list[Path] = []

    def candidates(self, ctx: BuildContext) -> Iterator[Candidate]:
        git_dir = ctx.project.git_dir
        if git_dir is None:
            return
        try:
            revs = _git(git_dir, "log", "--no-merges", f"-n{self.max_commits}", "--format=%H").split()
        except BootstrapError as exc:
            logger.warning("commit pipeline: %s", exc)
            return
        for rev in revs:
            cand = self._candidate(ctx, git_dir, rev)
            if cand is not None:
                yield cand

    def _candidate(self, ctx: BuildContext, git_dir: Path, rev: str) -> Candidate | None:
        parents = _git(git_dir, "rev-list", "--parents", "-n1", rev).split()[1:]
        if len(parents) != 1:
            return None
        parent = parents[0]
        changed = [
            line.split("\t")
            for line in _git(git_dir, "diff", "--name-status", "--no-renames", parent, rev).splitlines()
        ]
        paths = [c[-1] for c in changed if len(c) >= 2]
        tests = [p for p in paths if is_test_file(p) and not p.endswith("conftest.py")]
        code = [p for p in paths if p not in tests]
        if not tests or not any(p.endswith(".py") for p in code) or len(paths) > MAX_CHANGED_FILES:
            return None
        tree = Path(tempfile.mkdtemp(prefix=f"vriksha-commit-{rev[:10]}-"))
        self._trees.append(tree)
        raw = Path(tempfile.mkdtemp(prefix="raw-", dir=tree.parent))
        with tarfile.open(
            fileobj=io.BytesIO(_git(git_dir, "archive", "--format=tar", rev, binary=True))
        ) as tf:
            tf.extractall(raw, filter="data")
        shutil.rmtree(tree)
        copy_tree(raw, tree)
        shutil.rmtree(raw, ignore_errors=True)
        try:
            base_line = run_baseline(ctx.python, tree, runs=2, timeout_s=ctx.baseline.timeout_for())
        except BootstrapError as exc:
            logger.info("commit %s: no usable baseline (%s)", rev[:10], str(exc).splitlines()[0])
            return None
        covering = {nid for nid in base_line.stable_pass if nid.split("::", 1)[0] in tests}
        covering_any = {nid for nid in base_line.durations if nid.split("::", 1)[0] in tests}
        message = _git(git_dir, "log", "-1", "--format=%B", rev)
        diff = _git(git_dir, "diff", parent, rev, "--", *code)
        return Candidate(
            pipeline=self.name,
            target=rev,
            broken={p: _show(git_dir, parent, p) for p in code},
            solution={p: _show(git_dir, rev, p) for p in code},
            covering=covering,
            covering_any=covering_any,
            hidden_extra=set(tests),
            info={"commit": rev, "parent": parent, "message": strip_identifiers(message, diff)},
            base=tree,
            baseline=base_line,
        )

    def instruction(self, cand: Candidate, broken_run: TestRun, fail_to_pass: list[str]) -> str:
        return (
            "Make this change to the project (the description comes from its history; the tests that check it "
            "are hidden and run when you submit):\n\n"
            f"{cand.info['message']}\n\n"
            f"{len(fail_to_pass)} hidden test(s) must pass afterwards, and the existing tests must keep passing. "
            "Run the visible tests with the run_tests tool.\n"
        )

    def close(self) -> None:
        for tree in self._trees:
            shutil.rmtree(tree, ignore_errors=True)
