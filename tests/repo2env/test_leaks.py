"""Each leak route, tried against real tasks: the workspace holds no solution and no hidden tests."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from vriksha.repo2env.dataset import Dataset
from vriksha.repo2env.task import pack_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def littered_dataset(tmp_path_factory):
    """A tiny project whose source tree carries litter that holds the original code: bytecode,
    a build/ copy, egg-info, a .git with history; the build must keep all of it out of workspaces."""
    from r2e_projects import git, tiny_project

    from vriksha.repo2env.builder import BuildConfig, build_dataset

    src = tiny_project(tmp_path_factory.mktemp("littered"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "tinyproj")], check=True)
    (src / "build" / "lib" / "tinyproj").mkdir(parents=True)
    (src / "build" / "lib" / "tinyproj" / "mathx.py").write_text((src / "tinyproj" / "mathx.py").read_text())
    (src / "tinyproj.egg-info").mkdir()
    (src / "tinyproj.egg-info" / "SOURCES.txt").write_text("tinyproj/mathx.py\n")
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "everything")
    out = tmp_path_factory.mktemp("littered-out")
    cfg = BuildConfig(pipelines=("implement_function",), max_tasks=2, progress=False, seed=1)
    report, manifest = build_dataset(src, out, cfg)
    assert manifest.tasks, report.render()
    return src, out


def _bodies(task) -> list[str]:
    """The removed code: every line of the solution that the workspace version lacks."""
    out = []
    for rel, data in task.solution.items():
        ws_lines = set(task.workspace[rel].decode().splitlines())
        out += [line.strip() for line in data.decode().splitlines() if line.strip() and line not in ws_lines]
    return out


def test_workspace_holds_no_original_body(littered_dataset):
    _, out = littered_dataset
    ds = Dataset(out)
    for tid in ds.task_ids:
        task = ds.task(tid)
        missing = [line for line in _bodies(task) if len(line) > 8]
        assert missing, "the test needs a removed body to search for"
        blob = b"\n".join(task.workspace.values()).decode("utf-8", "replace")
        for line in missing:
            assert line not in blob, f"{tid}: the workspace still holds {line!r}"
        assert all(line not in task.instruction for line in missing)


def test_no_git_bytecode_build_or_egg_info_in_workspace(littered_dataset):
    src, out = littered_dataset
    assert (
        (src / ".git").is_dir() and list(src.rglob("*.pyc")) and (src / "build").is_dir()
    )  # the litter is there
    ds = Dataset(out)
    for tid in ds.task_ids:
        names = list(ds.task(tid).workspace)
        assert not [
            n for n in names if re.search(r"(^|/)(\.git|__pycache__|build|[^/]*\.egg-info)(/|$)|\.pyc$", n)
        ], names


def test_workspace_archive_is_the_only_thing_the_agent_gets(littered_dataset):
    _, out = littered_dataset
    ds = Dataset(out)
    for tid in ds.task_ids:
        task = ds.task(tid)
        names = set(task.workspace)
        assert not names & {"task.json", "instruction.md", "deleted.json"}
        assert not any(n.endswith((".tar.gz", "files.tar.gz")) for n in names)
        # hidden tests are absent from the workspace, and they are the fail-to-pass tests' files
        assert task.hidden and not set(task.hidden) & names
        assert {t.split("::")[0] for t in task.meta.fail_to_pass} <= set(task.hidden)
        # the private parts of the task directory are closed to other users (the sandbox runs as one)
        for private in ("hidden", "solution"):
            assert (task.path / private).stat().st_mode & 0o077 == 0
        assert pack_files(task.workspace) == (task.path / "workspace.tar.gz").read_bytes()


def test_venv_holds_no_copy_of_the_project(littered_dataset):
    _, out = littered_dataset
    ds = Dataset(out)
    task = ds.task(ds.task_ids[0])
    venv = ds.venv(task.meta.venv_key)
    hits = [p for p in venv.rglob("mathx.py")]
    assert hits == []


def test_agent_code_cannot_read_the_solution_or_hidden_tests_from_the_sandbox(littered_dataset):
    """The agent writes a test that looks for the task directory and the solution; run_tests runs it.
    Every test run is sandboxed (sandbox=False included): the private root holds only the run's copy."""
    from vriksha.repo2env.environment import RepoEnv

    _, out = littered_dataset
    ds = Dataset(out)
    task = ds.task(ds.task_ids[0])
    secret = task.path / "solution" / "files.tar.gz"
    hidden = task.path / "hidden" / "tests.tar.gz"
    probe = (
        "from pathlib import Path\n\n"
        "def test_probe():\n"
        "    readable = []\n"
        f"    for p in [{str(secret)!r}, {str(hidden)!r}, {str(task.path / 'task.json')!r}]:\n"
        "        try:\n"
        "            Path(p).read_bytes()\n"
        "            readable.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "    assert readable == []\n"
    )
    outputs = {}
    for sandbox in (True, False):
        env = RepoEnv(dataset=out, sandbox=sandbox)
        env.reset(seed=0, options={"task_id": task.meta.id})
        env.call_tool("write_file", {"path": "tests/test_probe.py", "content": probe})
        outputs[sandbox] = env.call_tool("run_tests", {"tests": "tests/test_probe.py"})
        env.close()
    assert "1 passed" in outputs[True], outputs[True]
    assert "1 passed" in outputs[False], outputs[False]
    # the same probe run here, outside the sandbox, does reach the files: it is a real probe
    ns: dict = {}
    exec(probe, ns)
    with pytest.raises(AssertionError):
        ns["test_probe"]()
