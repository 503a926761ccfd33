"""Which files of a project are tests, which are library source, and how node ids map to files."""

from __future__ import annotations

from pathlib import PurePosixPath

__all__ = ["is_test_file", "is_source_file", "file_of", "TEST_DIRS"]

TEST_DIRS = {"tests", "test", "testing"}
_NOT_SOURCE_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "benchmark", "scripts", "tools", "ci"}
_NOT_SOURCE_FILES = {"setup.py", "noxfile.py", "conftest.py", "fabfile.py", "tasks.py", "conf.py"}


def is_test_file(rel: str) -> bool:
    p = PurePosixPath(rel)
    if p.suffix != ".py":
        return False
    name = p.name
    return (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name == "tests.py"
        or name == "conftest.py"
        or any(part in TEST_DIRS for part in p.parts[:-1])
    )


def is_source_file(rel: str) -> bool:
    p = PurePosixPath(rel)
    return (
        p.suffix == ".py"
        and not is_test_file(rel)
        and p.name not in _NOT_SOURCE_FILES
        and not any(part in _NOT_SOURCE_DIRS or part.startswith(".") for part in p.parts[:-1])
        and len(p.parts) >= 1
    )


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]
