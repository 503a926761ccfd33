"""Fast unit tests: declared test dependencies, mutations, body removal, sources, the task format."""

from __future__ import annotations

import ast
import io
import tarfile

import pytest

from vriksha.repo2env.deps import declared_test_deps
from vriksha.repo2env.errors import SourceError, TaskFormatError
from vriksha.repo2env.pipelines.base import project_functions
from vriksha.repo2env.pipelines.implement_function import remove_body
from vriksha.repo2env.pipelines.mutations import KINDS, mutations_in
from vriksha.repo2env.source import content_hash, prepare_source
from vriksha.repo2env.task import pack_files, unpack_files


def test_declared_test_deps_from_every_source(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\n[project.optional-dependencies]\ntests = ["hypothesis"]\ndocs = ["sphinx"]\n'
        '[dependency-groups]\ntest = ["pytest-mock", {include-group = "extra"}]\nextra = ["freezegun"]\n'
    )
    (tmp_path / "requirements-test.txt").write_text("# comment\nattrs>=20\n-e .\n")
    deps = declared_test_deps(tmp_path)
    assert deps.extras == ["tests"]
    assert deps.requirements == ["pytest-mock", "freezegun", "attrs>=20"]
    assert any("dependency group" in s for s in deps.sources)


def test_tox_hints_when_nothing_else(tmp_path):
    (tmp_path / "tox.ini").write_text(
        "[testenv]\ndeps =\n    pytest\n    py38: mock\n    {posargs}\ncommands = pytest\n"
    )
    assert declared_test_deps(tmp_path).requirements == ["pytest", "mock"]


SRC = '''\
def f(xs, n):
    """Doc."""
    out = []
    for i in range(n - 1):
        if xs[i] < n and i != 0:
            out.append(xs[1:])
        else:
            out.append(i / n)
    return True


def g(x): return x * 2 + 1
'''


def test_mutations_cover_every_kind_and_parse():
    fn = ast.parse(SRC).body[0]
    muts = list(mutations_in(SRC, fn))
    assert {m.kind for m in muts} == set(KINDS)
    for m in muts:
        new = m.apply(SRC)
        assert new != SRC
        ast.parse(new)


def test_remove_body_keeps_signature_and_docstring(tmp_path):
    (tmp_path / "m.py").write_text(SRC)
    fns = {f.qualname: f for f in project_functions(tmp_path)}
    new, body = remove_body(fns["f"])
    assert 'def f(xs, n):\n    """Doc."""\n    raise NotImplementedError' in new
    assert "out.append" not in new and "out.append" in body
    ast.parse(new)
    new_g, _ = remove_body(fns["g"])
    assert "def g(x): raise NotImplementedError" in new_g


def test_sdist_source_is_unpacked_and_hashed_without_litter(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in {
            "pkg-1.0/pkg.py": b"x = 1\n",
            "pkg-1.0/PKG-INFO": b"Name: pkg\n",
            "pkg-1.0/__pycache__/pkg.cpython-311.pyc": b"junk",
            "../evil.py": b"bad",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(buf.getvalue())
    project = prepare_source(archive, tmp_path / "work")
    assert project.name == "pkg"
    assert sorted(p.name for p in project.root.iterdir()) == ["PKG-INFO", "pkg.py"]
    assert not (tmp_path / "evil.py").exists()
    assert project.content_hash == content_hash(project.root)
    with pytest.raises(SourceError):
        prepare_source(tmp_path / "missing-dir/", tmp_path / "work")


def test_pack_is_deterministic_and_roundtrips():
    files = {"b.py": b"2", "a/c.py": b"1"}
    assert pack_files(files) == pack_files(dict(reversed(files.items())))
    assert unpack_files(pack_files(files)) == files


def test_tampered_task_is_refused(tiny_dataset):
    from vriksha.repo2env.dataset import Dataset

    _, _, out = tiny_dataset
    ds = Dataset(out)
    tid = ds.task_ids[0]
    path = out / "tasks" / tid / "instruction.md"
    original = path.read_text()
    path.write_text(original + "tampered")
    try:
        with pytest.raises(TaskFormatError):
            ds.task(tid)
    finally:
        path.write_text(original)
    assert ds.task(tid).instruction == original


def test_solution_windows_catch_an_untouched_copy_of_the_fixed_code():
    from vriksha.repo2env.candidate_check import find_leaks, solution_windows

    fixed = "def a(k):\n    v = get(k)\n    if k in self:\n        touch(k)\n    return v\n"
    broken = fixed.replace("if k in self", "if k not in self")
    windows = solution_windows(fixed, broken)
    assert windows and all("if k in self" in w for w in windows)
    copy_elsewhere = {
        "m.py": broken.encode(),
        "other.py": ("class C:\n" + fixed.replace("\n", "\n    ")).encode(),
    }
    assert find_leaks(copy_elsewhere, windows, {}) == ["other.py: holds the removed code"]
    assert find_leaks({"m.py": broken.encode()}, windows, {}) == []
    assert find_leaks({"tests/test_m.py": b"x"}, [], {"tests/test_m.py": b"x"}) == [
        "tests/test_m.py: a hidden test file"
    ]
