"""The whole flow on a real project's sdist fetched from the package index at test time."""

from __future__ import annotations

import urllib.request

import pytest

from vriksha.repo2env.source import _INDEX

pytestmark = [pytest.mark.slow, pytest.mark.network]

PROJECT = "inflection==0.5.1"  # pure Python, no dependencies, 455 pytest tests in its sdist


def _index_reachable() -> bool:
    try:
        urllib.request.urlopen(f"{_INDEX}/inflection/", timeout=15).read(100)
        return True
    except OSError:
        return False


def test_real_sdist_becomes_served_tasks(tmp_path):
    if not _index_reachable():
        pytest.skip(f"the package index ({_INDEX}) is unreachable: cannot fetch {PROJECT}")
    from vriksha.envs.registry import make_env
    from vriksha.repo2env.builder import BuildConfig, build_dataset
    from vriksha.repo2env.dataset import Dataset

    out = tmp_path / "ds"
    cfg = BuildConfig(
        pipelines=("implement_function", "fix_bug"), max_tasks=1, workers=1, progress=False, seed=3
    )
    report, manifest = build_dataset(PROJECT, out, cfg)
    assert report.tests >= 400 and report.stable_passing >= 400, report.render()
    assert len(manifest.tasks) == 1, report.render()
    ds = Dataset(out)
    venv = ds.venv(ds.task(ds.task_ids[0]).meta.venv_key)
    assert not list(venv.rglob("inflection/__init__.py")), (
        "the venv must not hold a copy of the project's code"
    )
    assert list(venv.rglob("inflection-0.5.1.dist-info"))  # its metadata stays
    for tid in ds.task_ids:
        task = ds.task(tid)
        env = make_env("repo", dataset=out, sandbox=True)
        env.reset(seed=0, options={"task_id": tid})
        assert env.step({"tool": "submit"}).reward == 0.0
        env.reset(seed=0, options={"task_id": tid})
        for rel, data in task.solution.items():
            env.call_tool("write_file", {"path": rel, "content": data.decode()})
        assert env.step({"tool": "submit"}).reward == 1.0
        env.close()
