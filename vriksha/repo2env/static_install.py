"""Install a project with static metadata without building it: no repository code runs.

A PEP 621 `pyproject.toml` without `setup.py` and without dynamic dependencies says everything pip
needs: its dependencies (plus those of the test extras) are installed directly, and a minimal
`.dist-info` (name, version) stands in for the project itself, so `importlib.metadata` finds it.
A build (which runs the project's build backend, or its `setup.py`) is never started for it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["StaticProject", "static_project", "write_dist_info", "canonical"]

_REQ = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(slots=True)
class StaticProject:
    name: str
    version: str
    requirements: list[str] = field(default_factory=list)


def static_project(root: Path, extras: list[str]) -> StaticProject | None:
    """The project's name, version and requirements (with `extras`), or None when a build is needed."""
    pyproject = root / "pyproject.toml"
    if (root / "setup.py").is_file() or not pyproject.is_file():
        return None
    try:
        data = tomllib.loads(pyproject.read_text(errors="replace"))
    except tomllib.TOMLDecodeError:
        return None
    project = data.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        return None
    dynamic = set(project.get("dynamic", []))
    if dynamic & {"dependencies", "optional-dependencies"}:
        return None
    version = project.get("version") if "version" not in dynamic else None
    me = canonical(project["name"])
    reqs = [r for r in project.get("dependencies", []) if isinstance(r, str)]
    optional = project.get("optional-dependencies", {}) or {}
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for r in optional.get(extra, []):
            m = _REQ.match(r) if isinstance(r, str) else None
            if m is None:
                continue
            if canonical(m.group(1)) == me:  # a self-reference: project[other] pulls in another extra
                todo += [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
            else:
                reqs.append(r)
    return StaticProject(project["name"], str(version or "0.0.0"), list(dict.fromkeys(reqs)))


def write_dist_info(site_packages: Path, project: StaticProject) -> Path:
    """A minimal installed-distribution record for `project` (metadata only, no code)."""
    d = site_packages / f"{re.sub(r'[-_.]+', '_', project.name)}-{project.version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project.name}\nVersion: {project.version}\n")
    (d / "INSTALLER").write_text("vriksha-repo2env\n")
    (d / "RECORD").write_text("")
    return d
