"""The commit pipeline on a git checkout: revert the fix, hide its new test, strip identifiers."""

from __future__ import annotations

import pytest

from vriksha.repo2env.dataset import Dataset
from vriksha.repo2env.pipelines.commit import strip_identifiers

pytestmark = pytest.mark.slow


def test_strip_identifiers_removes_the_fix_names():
    diff = "-    return n % 2 == 1\n+    return n % 2 == 0\n def is_even(n):\n"
    msg = strip_identifiers(
        "Fix is_even for odd numbers\n\n`is_even(4)` was False; fixes #12.", diff + "+is_even\n"
    )
    assert "is_even" not in msg and "#12" not in msg
    assert "odd numbers" in msg


def test_commit_task_from_git_history(tmp_path):
    from r2e_projects import git_project

    from vriksha.repo2env.builder import BuildConfig, build_dataset

    src = git_project(tmp_path / "gitproj")
    report, manifest = build_dataset(
        src, tmp_path / "out", BuildConfig(pipelines=("commit",), progress=False)
    )
    assert report.kept["commit"] == 1, report.render()
    ds = Dataset(tmp_path / "out")
    task = ds.task(ds.task_ids[0])
    assert task.meta.fail_to_pass == ["tests/test_even.py::test_is_even"]
    assert task.meta.pass_to_pass == ["tests/test_inc.py::test_inc"]
    assert "tests/test_even.py" in task.hidden and "tests/test_even.py" not in task.workspace
    assert "n % 2 == 1" in task.workspace["gitproj/numbers.py"].decode()
    assert not any(".git" in name.split("/") for name in task.workspace)
    assert "is_even" not in task.instruction and "wrong parity" in task.instruction
