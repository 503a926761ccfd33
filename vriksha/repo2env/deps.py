"""Read what a project declares for its tests: extras, PEP 735 groups, requirements files, tox/nox hints."""

from __future__ import annotations

import configparser
import logging
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["TestDeps", "declared_test_deps"]

TEST_NAMES = ("test", "tests", "testing")
DEV_NAMES = ("dev", "develop", "development")
_SKIP = re.compile(r"^(-e\s|\.|\{|#)|\$\{|\{env", re.I)


@dataclass(slots=True)
class TestDeps:
    extras: list[str] = field(default_factory=list)  # installed as project[extra,...]
    requirements: list[str] = field(default_factory=list)  # plain requirement strings
    sources: list[str] = field(default_factory=list)  # where each piece came from, for the report


def _pick(names: list[str]) -> list[str]:
    lower = {n.lower(): n for n in names}
    chosen = [lower[n] for n in lower if n in TEST_NAMES or n.startswith(("test-", "tests-", "test_"))]
    if not chosen:
        chosen = [lower[n] for n in lower if n in DEV_NAMES]
    return chosen


def _group(groups: dict, name: str, seen: set[str]) -> list[str]:
    if name in seen:
        return []
    seen.add(name)
    out: list[str] = []
    for item in groups.get(name, []):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and "include-group" in item:
            out += _group(groups, item["include-group"], seen)
    return out


def _requirements_file(path: Path, seen: set[Path]) -> list[str]:
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    out: list[str] = []
    for raw in path.read_text(errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += _requirements_file(path.parent / line.split(None, 1)[1], seen)
        elif line.startswith("-c ") or line.startswith("--"):
            continue
        elif not _SKIP.search(line):
            out.append(line)
    return out


def _tox_deps(path: Path, root: Path) -> list[str]:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cp.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        return []
    out: list[str] = []
    for section in ("testenv", "tox:testenv"):
        if cp.has_option(section, "deps"):
            for line in cp.get(section, "deps").splitlines():
                line = re.sub(r"^[\w\-,{}]+:\s*", "", line.strip())  # factor-conditional lines
                if line.startswith("-r"):
                    out += _requirements_file(root / line[2:].strip(), set())
                elif line and not _SKIP.search(line):
                    out.append(line)
    return out


def _nox_deps(path: Path) -> list[str]:
    out: list[str] = []
    for call in re.findall(r"session\.install\(([^)]*)\)", path.read_text(errors="replace")):
        for item in re.findall(r"""["']([^"']+)["']""", call):
            if not _SKIP.search(item) and not item.startswith("-"):
                out.append(item)
    return out


def declared_test_deps(root: Path) -> TestDeps:
    """Everything the project says its tests need (the project itself excluded)."""
    deps = TestDeps()
    pyproject = root / "pyproject.toml"
    data: dict = {}
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(errors="replace"))
        except tomllib.TOMLDecodeError as exc:
            logger.warning("%s: cannot parse (%s); ignoring its test extras", pyproject, exc)
    extras = _pick(list(data.get("project", {}).get("optional-dependencies", {})))
    if not extras and not data.get("project") and (root / "setup.py").is_file():
        extras = list(
            TEST_NAMES
        )  # setup.py extras are dynamic: ask for the usual names, pip skips absent ones
    if not extras and (root / "setup.cfg").is_file():
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            cp.read(root / "setup.cfg")
            if cp.has_section("options.extras_require"):
                extras = _pick(cp.options("options.extras_require"))
        except configparser.Error:
            pass
    if extras:
        deps.extras = extras
        deps.sources.append(f"extras {extras}")
    groups = data.get("dependency-groups", {})
    for name in _pick(list(groups)):
        reqs = _group(groups, name, set())
        deps.requirements += reqs
        deps.sources.append(f"dependency group {name!r}")
    seen: set[Path] = set()
    patterns = (
        "requirements*test*.txt",
        "test*requirements*.txt",
        "requirements/test*.txt",
        "tests/requirements*.txt",
        "requirements-dev.txt",
        "dev-requirements.txt",
        "requirements/dev*.txt",
    )
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            reqs = _requirements_file(path, seen)
            if reqs:
                deps.requirements += reqs
                deps.sources.append(str(path.relative_to(root)))
    for fname, reader in (("tox.ini", lambda p: _tox_deps(p, root)), ("noxfile.py", _nox_deps)):
        if (root / fname).is_file() and not deps.requirements and not deps.extras:
            reqs = reader(root / fname)
            if reqs:
                deps.requirements += reqs
                deps.sources.append(fname)
    deps.requirements = list(dict.fromkeys(deps.requirements))
    return deps
