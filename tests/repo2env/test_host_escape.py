"""Repository code never runs on the host: a direct-URL dependency is refused before anything fetches or
builds it, a `.pth` file in the project's wheel runs only inside the sandbox (the venv's interpreter is
never started outside it), and `submit` copies the workspace without following its symlinks."""

from __future__ import annotations

import os
import uuid
import zipfile
from pathlib import Path

import pytest
from r2e_projects import tiny_project, write

from vriksha.repo2env.errors import BootstrapError

# writes who ran it, and in which network namespace, next to the marker path it is given
RECORDER = """\
import json, os, sys
def record(marker):
    with open(marker, "a") as f:
        f.write(json.dumps({"uid": os.getuid(), "netns": os.readlink("/proc/self/ns/net")}) + "\\n")
"""


def _world_readable(path: Path) -> Path:
    path.chmod(0o755)
    return path


def test_requirements_by_url_path_or_option_are_refused_with_a_clear_message():
    from vriksha.repo2env.venv_install import index_requirement, index_requirements

    for text in (
        "evil @ https://example.invalid/evil-1.0.tar.gz",
        "evil @ file:///tmp/evil",
        "evil@git+https://x/y",
    ):
        with pytest.raises(BootstrapError, match="direct URL or path dependency"):
            index_requirement(text, "proj")
    for text in ("./local/dir", "/abs/evil-1.0-py3-none-any.whl", "--index-url=http://evil", "-e ."):
        with pytest.raises(BootstrapError, match="by name from the package index only"):
            index_requirement(text, "proj")
    assert index_requirement("attrs>=20; python_version > '3'", "proj").name == "attrs"
    kept, refused = index_requirements(["attrs", "git+https://example.invalid/x.git"], "tests")
    assert kept == ["attrs"] and len(refused) == 1 and "left out" in refused[0]


@pytest.mark.slow
def test_a_direct_url_dependency_is_refused_and_never_built_on_the_host(tmp_path, r2e_cache):
    from vriksha.repo2env.bootstrap import bootstrap

    marker = tmp_path / "built-on-host.jsonl"
    dep = write(
        _world_readable(tmp_path) / "evildep",
        {
            "recorder.py": RECORDER,
            "setup.py": "import recorder\nfrom setuptools import setup\n"
            f"recorder.record({str(marker)!r})\nsetup(name='evildep', version='1.0', py_modules=['recorder'])\n",
        },
    )
    src = write(
        tmp_path / "urlproj",
        {
            "pyproject.toml": '[project]\nname = "urlproj"\nversion = "0.1"\n'
            f'dependencies = ["evildep @ file://{dep}"]\n',
            "urlproj.py": "X = 1\n",
        },
    )
    with pytest.raises(BootstrapError, match="direct URL or path dependency") as info:
        bootstrap(src, uuid.uuid4().hex, "urlproj")
    assert "evildep @ file://" in str(info.value)
    assert not marker.exists(), f"the dependency's build ran on the host: {marker.read_text()}"


SETUP_WITH_PTH = """\
import sys
from setuptools import setup

site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
setup(name="pthproj", version="1.0", py_modules=["pthproj"], data_files=[(site, ["zz_pthproj.pth"])])
"""


def _pth(marker: Path) -> str:
    """One .pth line: says it ran (stderr) and appends who ran it to `marker` where that path exists."""
    return (
        "import os, sys, json; sys.stderr.write('PTH-RAN\\n'); "
        f"os.path.isdir({str(marker.parent)!r}) and open({str(marker)!r}, 'a').write("
        "json.dumps({'uid': os.getuid(), 'argv': sys.argv}) + '\\n')\n"
    )


@pytest.mark.slow
def test_a_pth_file_in_the_built_wheel_never_runs_on_the_host(tmp_path, r2e_cache):
    from vriksha.repo2env.bootstrap import bootstrap

    marker = _world_readable(tmp_path) / "pth-ran-on-host.jsonl"
    src = write(
        tmp_path / "pthproj",
        {"setup.py": SETUP_WITH_PTH, "zz_pthproj.pth": _pth(marker), "pthproj.py": "X = 1\n"},
    )
    venv = bootstrap(src, uuid.uuid4().hex, "pthproj")
    record = next(venv.path.glob("lib/python3*/site-packages/pthproj-1.0.dist-info/RECORD")).read_text()
    assert "zz_pthproj.pth" in record, "the wheel's .pth file was never installed: the test proves nothing"
    assert not marker.exists(), f"the venv's interpreter ran on the host: {marker.read_text()}"


def _wheel_with_pth(folder: Path, marker: Path) -> Path:
    """A dependency published as a wheel whose only content is a .pth file."""
    path = folder / "pthdep-1.0-py3-none-any.whl"
    files = {
        "pthdep.pth": _pth(marker),
        "pthdep-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: pthdep\nVersion: 1.0\n",
        "pthdep-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(
            "pthdep-1.0.dist-info/RECORD",
            "".join(f"{n},,\n" for n in [*files, "pthdep-1.0.dist-info/RECORD"]),
        )
    return path


@pytest.mark.slow
def test_a_pth_file_of_a_dependency_runs_only_inside_the_sandbox(tmp_path, r2e_cache, monkeypatch):
    from vriksha.envs.sandbox import run_sandboxed
    from vriksha.repo2env.bootstrap import bootstrap

    marker = _world_readable(tmp_path) / "pth-ran-on-host.jsonl"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel_with_pth(wheels, marker)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: the dependency comes from this folder alone
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    src = write(
        tmp_path / "depproj",
        {
            "pyproject.toml": '[project]\nname = "depproj"\nversion = "0.1"\ndependencies = ["pthdep"]\n',
            "depproj.py": "X = 1\n",
        },
    )
    venv = bootstrap(src, uuid.uuid4().hex, "depproj")
    assert list(venv.path.glob("lib/python3*/site-packages/pthdep.pth")), "the .pth file is not installed"
    assert "pthdep==1.0" in venv.freeze  # the freeze is read from metadata, not by running the venv
    assert not marker.exists(), f"the venv's interpreter ran on the host: {marker.read_text()}"
    # inside the sandbox it does run, and still cannot reach the host's file
    res = run_sandboxed(
        ["/bin/sh", "-c", f"exec {venv.python} -c 'print(1)'"], ro_paths=[venv.path], timeout_s=60
    )
    assert res.exit_code == 0 and "PTH-RAN" in res.stderr, res.stderr
    assert not marker.exists()


def test_copy_workspace_keeps_links_inside_and_drops_links_out(tmp_path):
    from vriksha.repo2env.grading import copy_workspace

    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("X = 1\n")
    (ws / "alias.py").symlink_to("pkg/mod.py")
    (ws / "pkgalias").symlink_to("pkg")
    (ws / "abs.txt").symlink_to(outside)
    (ws / "rel.txt").symlink_to("../secret.txt")
    (ws / "escape").symlink_to(tmp_path)
    os.mkfifo(ws / "pipe")
    dst = tmp_path / "copy"
    dropped = copy_workspace(ws, dst)
    assert sorted(d.split(" ", 1)[0] for d in dropped) == ["abs.txt", "escape", "pipe", "rel.txt"]
    assert (dst / "pkg" / "mod.py").read_text() == "X = 1\n" and (dst / "alias.py").read_text() == "X = 1\n"
    assert os.readlink(dst / "pkgalias") == "pkg"
    assert not any(p.name in ("abs.txt", "rel.txt", "escape", "pipe") for p in dst.iterdir())


HIDDEN_TEST = """\
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_reads_what_the_workspace_links_to():
    seen = {}
    for name in ("leak.txt", "other/solution.py"):
        try:
            seen[name] = (ROOT / name).read_text()
        except OSError as exc:
            seen[name] = type(exc).__name__
    assert False, "SEEN " + repr(seen)
"""


@pytest.mark.slow
def test_submit_does_not_follow_symlinks_out_of_the_workspace(tmp_path, r2e_cache):
    from vriksha.repo2env.bootstrap import bootstrap
    from vriksha.repo2env.grading import verify
    from vriksha.repo2env.source import prepare_source
    from vriksha.repo2env.task import TaskFiles, TaskMeta

    project = prepare_source(tiny_project(tmp_path / "tiny"), r2e_cache / "sources")
    venv = bootstrap(project.root, project.content_hash, project.name)
    secret = tmp_path / "root-only.txt"
    secret.write_text(f"ROOT-ONLY-{uuid.uuid4().hex}")
    secret.chmod(0o600)
    other = tmp_path / "other-task-ws"
    other.mkdir()
    (other / "solution.py").write_text(f"OTHER-TASK-{uuid.uuid4().hex}")
    ws = tmp_path / "ws"
    ws.mkdir()
    for rel in ("tinyproj/__init__.py", "tinyproj/mathx.py"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text((project.root / rel).read_text())
    (ws / "leak.txt").symlink_to(secret)  # what apply_patch can create (git diffs carry symlinks)
    (ws / "other").symlink_to(other)
    nid = "tests/test_hidden.py::test_reads_what_the_workspace_links_to"
    meta = TaskMeta(
        id="t-links",
        repo="tinyproj",
        repo_origin=str(project.root),
        base_hash=project.content_hash,
        workspace_hash="",
        pipeline="fix_bug",
        target="crafted",
        fail_to_pass=[nid],
        pass_to_pass=[],
        hidden_files=["tests/test_hidden.py"],
        solution_files=[],
        venv_key=venv.key,
        timeout_s=60,
    )
    task = TaskFiles(
        meta=meta,
        instruction="",
        workspace={},
        hidden={"tests/test_hidden.py": HIDDEN_TEST.encode()},
        solution={},
    )
    verdict = verify(task, venv.path, ws)
    seen_line = next((ln for ln in verdict.output.splitlines() if "SEEN {" in ln), None)
    assert seen_line is not None, verdict.output[-3000:]
    assert secret.read_text() not in verdict.output and "OTHER-TASK-" not in verdict.output, seen_line
    assert (
        verdict.output.startswith("left out of the submission: ") and "leak.txt (a link to" in verdict.output
    )
    assert not verdict.resolved


def test_no_repo2env_code_starts_a_venv_interpreter_with_pip_python():
    """`pip --python VENV` runs the venv's interpreter (and its .pth files) on the host: never used."""
    root = Path(__import__("vriksha.repo2env", fromlist=["x"]).__file__).parent
    offenders = [p.name for p in root.rglob("*.py") if '"--python"' in p.read_text()]
    assert offenders == [], offenders


LINKING_CONFTEST = """\
import atexit, os


def _swap():  # after pytest wrote its results: put a link to a host file in their place
    out = os.environ["VRIKSHA_R2E_OUT"]
    os.remove(out)
    os.symlink(os.environ.get("HOST_JSON", "{host_json}"), out)


atexit.register(_swap)
"""


@pytest.mark.slow
def test_results_are_never_read_through_a_link_the_tests_left(tmp_path, r2e_cache):
    """The results file is read on the host, as the caller: a link to a host file in its place is refused."""
    from vriksha.repo2env.bootstrap import bootstrap
    from vriksha.repo2env.testrun import run_tests

    host_json = tmp_path / "other-task.json"
    host_json.write_text('{"tests": {"HOST-SECRET-NODE": {"outcome": "passed"}}}')
    host_json.chmod(0o600)
    src = tiny_project(tmp_path / "tiny")
    (src / "conftest.py").write_text(LINKING_CONFTEST.replace("{host_json}", str(host_json)))
    venv = bootstrap(src, uuid.uuid4().hex, "tinyproj")
    run = run_tests(venv.python, src, timeout_s=120)
    assert "HOST-SECRET-NODE" not in run.results and not any("HOST-SECRET" in w for w in run.warnings)
    assert run.results == {}  # what the tests left is not a results file
