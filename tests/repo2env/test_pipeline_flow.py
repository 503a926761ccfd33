"""The whole flow on a tiny project: each pipeline keeps tasks, each drop reason shows up, tasks re-validate."""

from __future__ import annotations

import pytest

from vriksha.repo2env.dataset_check import validate_dataset
from vriksha.repo2env.task import load_manifest

pytestmark = pytest.mark.slow


def test_tiny_project_yields_tasks_from_both_pipelines(tiny_dataset):
    report, manifest, out = tiny_dataset
    assert report.kept["implement_function"] >= 3  # clamp, total, shout
    assert report.kept["fix_bug"] >= 1
    assert report.flaky_tests == 1
    ids = {t.id for t in load_manifest(out).tasks}
    assert ids == {t.id for t in manifest.tasks} and len(ids) == sum(report.kept.values())


def test_drop_reasons_from_the_build(tiny_dataset):
    report, _, _ = tiny_dataset
    by = report.drops_by_pipeline["implement_function"]
    assert by["no_covering_test"] == 1  # never_called
    assert by["no_fail_to_pass"] == 1  # describe: its only test swallows errors
    assert by["flaky"] == 1  # coin: reached only by the flaky test
    assert report.covered["implement_function"] == report.candidates["implement_function"] - 1


def test_kept_tasks_have_disjoint_nonempty_test_lists(tiny_dataset):
    from vriksha.repo2env.dataset import Dataset

    _, _, out = tiny_dataset
    ds = Dataset(out)
    for tid in ds.task_ids:
        meta = ds.task(tid).meta
        assert meta.fail_to_pass and meta.pass_to_pass
        assert not set(meta.fail_to_pass) & set(meta.pass_to_pass)
        assert "tests/test_flaky.py::test_coin_alternates" not in meta.fail_to_pass + meta.pass_to_pass
        assert {f.split("::")[0] for f in meta.fail_to_pass} <= set(meta.hidden_files)


def test_kept_tasks_revalidate(tiny_dataset):
    _, _, out = tiny_dataset
    from vriksha.repo2env.dataset import Dataset

    ids = Dataset(out).task_ids
    picked = [next(t for t in ids if t.startswith(p)) for p in ("implement_function", "fix_bug")]
    checks = validate_dataset(out, progress=False, task_ids=picked)
    assert checks and all(c.ok for c in checks), [(c.task_id, c.oracle, c.empty, c.error) for c in checks]


def test_single_test_project_drops_for_no_pass_to_pass(tmp_path):
    from r2e_projects import single_test_project

    from vriksha.repo2env.builder import BuildConfig, build_dataset

    src = single_test_project(tmp_path / "one")
    report, manifest = build_dataset(
        src, tmp_path / "out", BuildConfig(pipelines=("implement_function",), progress=False)
    )
    assert manifest.tasks == []
    assert report.drops["no_pass_to_pass"] == 1
