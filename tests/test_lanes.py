"""The fast lane's guard (tests/lanes.py): a test outside `slow` cannot start a server, a trainer, torchrun,
several processes or a venv build, and may still run a short interpreter probe."""

import multiprocessing
import subprocess
import sys

import pytest

from tests.lanes import FastLaneViolation, heavy_command
from vriksha.net.launch import vriksha_command


@pytest.mark.parametrize(
    "argv, what",
    [
        (vriksha_command("serve", "--port", "8000"), "-m vriksha.cli"),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "x.py"],
            "-m torch.distributed.run",
        ),
        ([sys.executable, "-m", "vriksha.train", "c.yaml"], "-m vriksha.train"),
        ([sys.executable, "-m", "venv", "/tmp/v"], "-m venv"),
        (["/usr/bin/torchrun", "x.py"], "torchrun"),
        (["vriksha", "router"], "vriksha"),
        ([sys.executable, "-c", "print(1)"], None),
        (["/bin/sh", "-c", "echo -m vriksha"], None),
        ("git", None),
    ],
)
def test_heavy_commands_are_named(argv, what):
    assert heavy_command(argv) == what


def test_a_server_subprocess_outside_slow_fails():
    with pytest.raises(FastLaneViolation, match="-m vriksha.cli.*pytest.mark.slow"):
        subprocess.Popen(vriksha_command("serve", "--port", "1"))


def test_multiprocessing_outside_slow_fails():
    with pytest.raises(FastLaneViolation, match="multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=print).start()


def test_a_short_probe_still_runs():
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"


@pytest.mark.slow
def test_the_slow_lane_may_start_processes():
    done = subprocess.run(vriksha_command("--help"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "serve" in done.stdout


def test_the_measured_list_marks_whole_files_tests_and_cases(tmp_path, monkeypatch):
    import tests.lanes as lanes

    listed = frozenset({"tests/a.py", "tests/b.py::test_x", "tests/c.py::test_y[1]"})
    assert lanes._listed("tests/a.py::test_any[p]", listed)
    assert lanes._listed("tests/b.py::test_x[2]", listed) and not lanes._listed("tests/b.py::test_z", listed)
    assert lanes._listed("tests/c.py::test_y[1]", listed) and not lanes._listed(
        "tests/c.py::test_y[2]", listed
    )
    (tmp_path / "slow.txt").write_text("# measured\ntests/a.py  # 40 s\n\n")
    monkeypatch.setattr(lanes, "SLOW_LIST", tmp_path / "slow.txt")
    assert lanes.measured_slow() == {"tests/a.py"}
