"""Bootstrap: the venv is isolated and cached; failures say why."""

from __future__ import annotations

import subprocess

import pytest

from vriksha.repo2env.baseline import run_baseline
from vriksha.repo2env.bootstrap import bootstrap
from vriksha.repo2env.errors import BootstrapError
from vriksha.repo2env.source import prepare_source

pytestmark = pytest.mark.slow


def test_venv_is_isolated_and_cached(tiny_src, r2e_cache):
    project = prepare_source(tiny_src, r2e_cache / "sources")
    venv = bootstrap(project.root, project.content_hash, project.name)
    assert bootstrap(project.root, project.content_hash, project.name).path == venv.path
    cfg = (venv.path / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    probe = subprocess.run([str(venv.python), "-c", "import pydantic"], capture_output=True, text=True)
    assert probe.returncode != 0, "the host's packages must not be visible in the project venv"
    assert (
        subprocess.run([str(venv.python), "-m", "pytest", "--version"], capture_output=True).returncode == 0
    )


def test_project_whose_tests_all_fail_is_refused_with_the_reason(tmp_path, r2e_cache):
    from r2e_projects import write

    src = write(
        tmp_path / "bad",
        {
            "pyproject.toml": '[project]\nname = "bad"\nversion = "0.1"\n',
            "bad.py": "def f():\n    return 1\n",
            "test_bad.py": "import missing_module_for_sure\n\n\ndef test_f():\n    assert True\n",
        },
    )
    project = prepare_source(src, r2e_cache / "sources")
    venv = bootstrap(project.root, project.content_hash, project.name)
    with pytest.raises(BootstrapError, match="no test passes") as info:
        run_baseline(venv.python, project.root)
    assert "missing_module_for_sure" in str(info.value)


def test_uninstallable_dependency_is_reported(tmp_path, r2e_cache, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # fail fast, offline: the distribution exists nowhere anyway
    from r2e_projects import write

    src = write(
        tmp_path / "dep",
        {
            "pyproject.toml": '[project]\nname = "depproj"\nversion = "0.1"\n'
            'dependencies = ["vriksha-test-no-such-distribution-3141"]\n',
            "depproj.py": "X = 1\n",
        },
    )
    project = prepare_source(src, r2e_cache / "sources")
    with pytest.raises(BootstrapError, match="cannot install depproj") as info:
        bootstrap(project.root, project.content_hash, project.name)
    assert "error" in str(info.value).lower() and "pip-installable" in str(
        info.value
    )  # pip's own words, then what to do
