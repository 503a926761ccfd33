from __future__ import annotations

import os
from pathlib import Path

import pytest
from r2e_projects import tiny_project


@pytest.fixture(scope="session", autouse=True)
def r2e_cache(tmp_path_factory):
    """One repo2env cache (seed venv, project venvs) for the session; $VRIKSHA_TEST_CACHE reuses one
    across runs. Only repo2env reads VRIKSHA_REPO2ENV_CACHE, so other packages' caches are untouched."""
    old = os.environ.get("VRIKSHA_REPO2ENV_CACHE")
    root = os.environ.get("VRIKSHA_TEST_CACHE")
    path = Path(root) / "repo2env" if root else tmp_path_factory.mktemp("r2e-cache")
    os.environ["VRIKSHA_REPO2ENV_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("VRIKSHA_REPO2ENV_CACHE", None)
    else:
        os.environ["VRIKSHA_REPO2ENV_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_src(tmp_path_factory) -> Path:
    return tiny_project(tmp_path_factory.mktemp("tinyproj"))


@pytest.fixture(scope="session")
def tiny_dataset(tiny_src, tmp_path_factory):
    from vriksha.repo2env.builder import BuildConfig, build_dataset

    out = tmp_path_factory.mktemp("tiny-dataset")
    cfg = BuildConfig(pipelines=("implement_function", "fix_bug"), max_tasks=50, workers=2, progress=False)
    report, manifest = build_dataset(tiny_src, out, cfg)
    return report, manifest, out
