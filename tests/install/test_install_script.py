"""scripts/install.py: pip's settings handed to uv, so both installers take packages from the same places."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install.py"


@pytest.fixture(scope="module")
def install():
    spec = importlib.util.spec_from_file_location("vriksha_install_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
:env:.no-cache-dir='1'
global.find-links='/srv/old-wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
install.index-url='https://mirror.example/simple'
global.index-url='https://ignored.example/simple'
not a setting line
"""


def test_pip_settings_ranks_environment_over_install_over_global(install):
    settings = install.pip_settings(LISTING)
    assert settings["find-links"] == "/opt/wheels"  # :env: over global
    assert settings["index-url"] == "https://mirror.example/simple"  # [install] over [global]
    assert settings["extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    assert settings["no-cache-dir"] == "1"


def test_uv_options_carry_every_source_and_pips_ranking(install):
    args, env = install.uv_options(install.pip_settings(LISTING))
    pairs = list(zip(args, args[1:], strict=False))
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert ("--extra-index-url", "file:///opt/pypi/simple") in pairs
    assert ("--extra-index-url", "file:///opt/pypi-more/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs and ("--find-links", "/srv/old-wheels") not in pairs
    assert ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    assert ("--index-strategy", "unsafe-best-match") in pairs
    assert "--no-cache" in args
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"


def test_uv_options_without_pip_settings_are_uvs_defaults(install):
    assert install.uv_options({}) == ([], {})
    args, _ = install.uv_options({"no-cache-dir": "false"})
    assert "--no-cache" not in args


def test_a_bad_interpreter_is_named(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--python", str(tmp_path / "no-python")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "no-python" in done.stderr and "--python" in done.stderr
