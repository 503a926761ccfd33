"""The two test lanes, and the guard that keeps the fast one fast.

`make test` runs every test; `make test-fast` deselects the ones marked `slow`: those that start a server or a
trainer as a subprocess, run torchrun or several processes, build a virtual environment, or load a model for
more than a few seconds. So that a test which starts such a process cannot slip into the fast lane unmarked, a
test outside `slow` that starts one fails (in both lanes), naming what it started and the marker it needs. A
short `python -c` probe or the sandbox's interpreter is not such a process; `HEAVY_MODULES` and
`HEAVY_PROGRAMS` say what is. A test that uses a server or venv-building fixture (`SLOW_FIXTURES`) is marked `slow`
here, so the fixture's tests need no marker of their own.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

# `python -m NAME`: the command line, a trainer, a tensor-parallel rank, torchrun, a venv, pip, a web server
HEAVY_MODULES = frozenset(
    {"vriksha", "vriksha.cli", "vriksha.train", "vriksha.engine.tensor_parallel", "torch.distributed.run",
     "venv", "virtualenv", "pip", "uv", "uvicorn"}
)  # fmt: skip
HEAVY_PROGRAMS = frozenset({"vriksha", "torchrun", "uvicorn", "uv", "pip", "pip3", "virtualenv"})
# tests measured to take more than a few seconds of CPU (tests/slow_tests.txt: node ids, or a file or a test's name
# for all of its cases); they are `slow` without a marker in their file, and the list is refreshed from the
# durations CI prints
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")
# fixtures that start a server subprocess or build a venv (repo2env's dataset): every test that uses one, directly
# or through another fixture, is `slow`
SLOW_FIXTURES = frozenset({"server_factory", "replicas", "routed", "weight_server", "tiny_dataset"})


class FastLaneViolation(Exception):
    """A test outside `slow` started a server, a trainer, several processes or a venv build."""


def heavy_command(args: str | bytes | Sequence) -> str | None:
    """What makes `args` (a Popen argument list) a slow-lane process, or None when it is not one."""
    if isinstance(args, str | bytes | os.PathLike):
        argv = [os.fsdecode(args)]
    else:
        argv = [os.fsdecode(a) for a in args]
    if not argv:
        return None
    if os.path.basename(argv[0]) in HEAVY_PROGRAMS:
        return os.path.basename(argv[0])
    for flag, module in zip(argv, argv[1:], strict=False):
        if flag == "-m" and module in HEAVY_MODULES:
            return f"-m {module}"
    return None


def _refuse(what: str) -> None:
    raise FastLaneViolation(
        f"a test outside the slow lane started {what}: mark it `@pytest.mark.slow` (tests/lanes.py says what "
        "belongs there), or test the part in-process"
    )


class _Guard:
    def __init__(self) -> None:
        self.armed = False
        self._execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
        self._start = multiprocessing.process.BaseProcess.start
        guard = self

        def execute_child(popen: subprocess.Popen, args, *rest, **kw):  # noqa: ANN001, ANN202
            what = heavy_command(args) if guard.armed else None
            if what is not None:
                _refuse(f"the process `{what}`")
            return guard._execute_child(popen, args, *rest, **kw)

        def start(process: multiprocessing.process.BaseProcess) -> None:
            if guard.armed:
                _refuse(f"a multiprocessing process ({process.name})")
            guard._start(process)

        subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]


_guard = _Guard()


def measured_slow() -> frozenset[str]:
    """The entries of `SLOW_LIST` (comments and blank lines left out)."""
    lines = SLOW_LIST.read_text().splitlines() if SLOW_LIST.exists() else []
    return frozenset(x.split("#", 1)[0].strip() for x in lines if x.split("#", 1)[0].strip())


def _listed(nodeid: str, listed: frozenset[str]) -> bool:
    file, _, rest = nodeid.partition("::")
    return nodeid in listed or file in listed or f"{file}::{rest.split('[', 1)[0]}" in listed


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    listed = measured_slow()
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or _listed(item.nodeid, listed):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # setup, call and teardown alike: a module fixture that starts a server counts against its first user
    _guard.armed = item.get_closest_marker("slow") is None
    try:
        yield
    finally:
        _guard.armed = False
