"""Drop reasons that a clean tiny project does not produce on its own, from crafted candidates."""

from __future__ import annotations

import pytest

from vriksha.repo2env.baseline import Baseline, run_baseline
from vriksha.repo2env.bootstrap import bootstrap, cache_root
from vriksha.repo2env.candidate_check import validate_candidate
from vriksha.repo2env.pipelines import PIPELINES, Candidate
from vriksha.repo2env.source import prepare_source

pytestmark = pytest.mark.slow

CLAMP_TESTS = {f"tests/test_mathx.py::test_clamp_{k}" for k in ("low", "high", "inside")}


@pytest.fixture(scope="module")
def setup(tiny_src):
    project = prepare_source(tiny_src, cache_root() / "sources")
    venv = bootstrap(project.root, project.content_hash, project.name)
    base = run_baseline(venv.python, project.root)
    return project, venv, base


def _candidate(project, broken: dict[str, str], **kw) -> Candidate:
    return Candidate(
        pipeline="fix_bug",
        target="crafted",
        broken=broken,
        solution={rel: (project.root / rel).read_text() for rel in broken},
        covering=set(CLAMP_TESTS),
        covering_any=set(CLAMP_TESTS),
        **kw,
    )


def test_baseline_marks_the_alternating_test_flaky(setup):
    _, _, base = setup
    assert base.flaky == {"tests/test_flaky.py::test_coin_alternates"}
    assert CLAMP_TESTS <= base.stable_pass
    assert any(k.endswith("mathx.py::clamp") for k in base.coverage["tests/test_mathx.py::test_clamp_low"])


def test_infinite_loop_is_dropped_for_timeout(setup, monkeypatch):
    project, venv, base = setup
    monkeypatch.setattr(Baseline, "timeout_for", lambda self, tests=None, floor=0.0: 4.0)
    text = (
        (project.root / "tinyproj/mathx.py")
        .read_text()
        .replace("    if x < lo:\n", "    while True:\n        pass\n    if x < lo:\n")
    )
    out = validate_candidate(
        _candidate(project, {"tinyproj/mathx.py": text}), PIPELINES["fix_bug"](), project, venv, base
    )
    assert out.task is None and out.drop.reason == "timeout"


def test_change_breaking_an_uncovered_test_is_dropped_for_pass_to_pass(setup):
    project, venv, base = setup
    mathx = (project.root / "tinyproj/mathx.py").read_text().replace("if x < lo:", "if x > lo:")
    strings = (project.root / "tinyproj/strings.py").read_text().replace('"!"', '"?"')
    cand = _candidate(project, {"tinyproj/mathx.py": mathx, "tinyproj/strings.py": strings})
    out = validate_candidate(cand, PIPELINES["fix_bug"](), project, venv, base)
    assert out.task is None and out.drop.reason == "broke_pass_to_pass", out.drop


def test_solution_text_left_elsewhere_in_the_workspace_is_dropped_as_a_leak(setup):
    project, venv, base = setup
    mathx = (project.root / "tinyproj/mathx.py").read_text().replace("if x < lo:", "if x > lo:")
    cand = _candidate(project, {"tinyproj/mathx.py": mathx}, secrets=['text = s.upper()\nreturn text + "!"'])
    out = validate_candidate(cand, PIPELINES["fix_bug"](), project, venv, base)
    assert out.task is None and out.drop.reason == "leak" and "strings.py" in out.drop.detail


def test_the_same_candidate_without_the_leak_is_kept(setup):
    project, venv, base = setup
    mathx = (project.root / "tinyproj/mathx.py").read_text().replace("if x < lo:", "if x > lo:")
    out = validate_candidate(
        _candidate(project, {"tinyproj/mathx.py": mathx}), PIPELINES["fix_bug"](), project, venv, base
    )
    assert out.task is not None, out.drop
    meta = out.task.meta
    assert set(meta.fail_to_pass) <= CLAMP_TESTS and meta.fail_to_pass
    assert "tests/test_strings.py::test_shout" in meta.pass_to_pass
    assert meta.hidden_files == ["tests/test_mathx.py"]
    assert (
        "tests/test_mathx.py" not in out.task.workspace
        and "if x > lo:" in out.task.workspace["tinyproj/mathx.py"].decode()
    )
