"""`vriksha repo2env` as a user runs it: a real subprocess, a yield report, then `validate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vriksha.cli", "repo2env", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ},
    )


def test_build_then_validate(tiny_src, tmp_path):
    out = tmp_path / "ds"
    proc = _cli(
        str(tiny_src),
        "--out",
        str(out),
        "--pipelines",
        "implement_function",
        "--max-tasks",
        "1",
        "--no-progress",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kept"] == {"implement_function": 1}
    assert report["tasks_per_minute"] > 0
    proc = _cli("validate", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1/1 task(s) re-validate" in proc.stdout


def test_cli_errors_say_what_to_do(tmp_path, capsys):
    from vriksha.cli import main

    assert main(["repo2env", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 1
    assert "neither a directory" in capsys.readouterr().err
    assert main(["repo2env", "validate", str(tmp_path)]) == 1
    assert "manifest.json" in capsys.readouterr().err
    assert main(["repo2env", str(tmp_path)]) == 1
    assert "--out DIR is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["repo2env", "--help"])
    help_text = capsys.readouterr().out
    assert "validate DIR" in help_text and "--max-tasks" in help_text
