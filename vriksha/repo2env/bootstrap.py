"""One isolated virtual environment per project, cached by content hash: the dependency bootstrap, its
own step (with network; no test runs here; for a project with static metadata no repository code at
all, `static_install.py`; for one without, its build code runs only in the sandbox, `sandboxed_build.py`).

The venv is made with `python -m venv --without-pip` (no system site-packages) from a cached seed
venv that already holds pytest. Packages go in through `venv_install.py`: the host's pip collects
wheels (index packages only: URL and path dependencies are refused), and the venv's own interpreter
installs them inside the sandbox, network off; that interpreter never starts on the host. The
project is installed with its declared test dependencies, then its own code is removed from
site-packages again (its metadata stays): tests import the workspace copy through PYTHONPATH, and
the venv holds no copy of the code a task removes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vriksha.repo2env.deps import TestDeps, declared_test_deps
from vriksha.repo2env.errors import BootstrapError
from vriksha.repo2env.sandboxed_build import build_wheel_sandboxed
from vriksha.repo2env.static_install import canonical, static_project, write_dist_info
from vriksha.repo2env.venv_install import (
    copy_host_dists,
    freeze,
    index_requirement,
    index_requirements,
    install,
    site_packages,
    strip_distribution,
    venv_box,
    wheel_requirements,
)

logger = logging.getLogger(__name__)

__all__ = ["Venv", "bootstrap", "cache_root", "BOOTSTRAP_VERSION", "copy_venv"]

BOOTSTRAP_VERSION = "2"  # 2: packages installed inside the sandbox (venv_install.py)
SEED_PACKAGES = ["pytest"]


def cache_root() -> Path:
    """$VRIKSHA_REPO2ENV_CACHE, else $VRIKSHA_CACHE/repo2env (default ~/.cache/vriksha/repo2env)."""
    if os.environ.get("VRIKSHA_REPO2ENV_CACHE"):
        return Path(os.environ["VRIKSHA_REPO2ENV_CACHE"]).expanduser()
    return Path(os.environ.get("VRIKSHA_CACHE", Path.home() / ".cache" / "vriksha")).expanduser() / "repo2env"


@dataclass(slots=True)
class Venv:
    path: Path
    key: str
    deps: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    freeze: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def to_json(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Venv:
        return cls(**{**d, "path": Path(d["path"])})


def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "w")  # noqa: SIM115
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def _make_venv(venv: Path) -> None:
    """`python -m venv --without-pip` by this interpreter (the new venv's own is not started)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired as exc:
        raise BootstrapError("python -m venv took more than 300 s; check the disk") from exc
    if proc.returncode:
        raise BootstrapError(f"python -m venv failed: {proc.stderr.strip()[-2000:]}")


def _seed() -> Path:
    """A venv with pytest installed, made once per Python version and copied for each project."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-v{BOOTSTRAP_VERSION}"
    seed = cache_root() / f"seed-{tag}"
    with _lock(cache_root() / f"seed-{tag}.lock"):
        if (seed / "ready").exists():
            return seed
        shutil.rmtree(seed, ignore_errors=True)
        with venv_box(cache_root(), f"seed-{tag}-") as venv:
            _make_venv(venv)
            failed = install(venv, SEED_PACKAGES, "pytest (the seed venv)")
            if failed is not None and copy_host_dists(venv, SEED_PACKAGES):
                logger.warning(
                    "the package index is unreachable: the seed venv got a copy of this interpreter's pytest"
                )
            elif failed is not None:
                raise BootstrapError(
                    f"cannot install {SEED_PACKAGES} into the seed venv: {failed.stderr.strip()[-2000:]}; "
                    "check that the package index (or a wheel cache) is reachable"
                )
            (venv / "ready").write_text("ok")
            venv.rename(seed)
    return seed


def copy_venv(src: Path, dst: Path) -> None:
    """Copy a venv (symlinks kept; always call its python with -m, so script shebangs do not matter)."""
    shutil.copytree(src, dst, symlinks=True)  # keep the bytecode: tests run with PYTHONDONTWRITEBYTECODE


def _needs_install(root: Path, deps: TestDeps) -> bool:
    """False when the project statically declares no dependencies at all (nothing to install)."""
    if deps.extras or deps.requirements or (root / "setup.py").is_file() or (root / "setup.cfg").is_file():
        return True
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return False
    try:
        project = tomllib.loads(pyproject.read_text(errors="replace")).get("project", {})
    except tomllib.TOMLDecodeError:
        return True
    return "dependencies" in project.get("dynamic", []) or bool(project.get("dependencies"))


def _not_installable(name: str, failed: subprocess.CompletedProcess, what: str = "") -> BootstrapError:
    return BootstrapError(
        f"cannot install {name}{what} into its venv: {failed.stderr.strip()[-2000:]}; "
        "the project must be pip-installable (pure Python) with its dependencies on the index"
    )


def _install_build_requirements(venv: Path, reqs: list[str], what: str) -> None:
    """Install index packages into a build venv; offline, copy this interpreter's own copies."""
    failed = install(venv, reqs, what)
    if failed is None:
        return
    if copy_host_dists(venv, [index_requirement(r, what).name for r in reqs]):
        logger.warning("the package index is unreachable: %s copied from this interpreter", what)
        return
    raise BootstrapError(f"cannot install {what} ({' '.join(reqs)}): {failed.stderr.strip()[-2000:]}")


def _install_by_build(
    root: Path,
    venv: Path,
    deps: TestDeps,
    name: str,
    install_project: bool,
    scratch: Path,
    warnings: list[str],
) -> str:
    """The project is built into a wheel in the sandbox (`sandboxed_build.py`); its dependencies are
    checked (index packages only) and installed with it (`venv_install.py`), then its code is removed."""
    install_project = install_project and _needs_install(root, deps)
    spec = ""
    try:
        if install_project:
            wheel = build_wheel_sandboxed(root, scratch, _seed(), _install_build_requirements)
            wheel_requirements(wheel, deps.extras)  # refuses URL and path dependencies
            spec = str(wheel) + (f"[{','.join(deps.extras)}]" if deps.extras else "")
        if spec or deps.requirements:
            failed = install(
                venv, [spec] * bool(spec) + deps.requirements, f"{name} and its test dependencies"
            )
            if failed is not None and deps.requirements and spec:
                warnings.append(
                    f"installing the declared test requirements failed ({failed.stderr.strip()[-300:]}); "
                    "retried with the project alone"
                )
                failed = install(venv, [spec], name)
            if failed is not None:
                raise _not_installable(name, failed)
    finally:
        if spec:
            Path(spec.split("[", 1)[0]).unlink(missing_ok=True)
    if install_project:
        warnings += strip_distribution(venv, name)
    return spec or "(nothing to install)"


def bootstrap(root: Path, content_hash: str, name: str, *, install_project: bool = True) -> Venv:
    """The cached venv for the project at `root` (made on first use). Raises BootstrapError with the reason."""
    key = hashlib.sha256(f"{content_hash}|{sys.version}|{BOOTSTRAP_VERSION}".encode()).hexdigest()[:20]
    target = cache_root() / "venvs" / key
    with _lock(cache_root() / "venvs" / f"{key}.lock"):
        meta = target / "vriksha-venv.json"
        if meta.is_file():
            return Venv.from_json(json.loads(meta.read_text()))
        start = time.monotonic()
        seed = _seed()
        with venv_box(target.parent, f"{key}-") as venv:
            copy_venv(seed, venv)
            deps: TestDeps = declared_test_deps(root)
            warnings: list[str] = []
            deps.requirements, refused = index_requirements(deps.requirements, f"{name}'s test requirements")
            warnings += refused
            static = static_project(root, deps.extras) if install_project else None
            if static is not None:  # everything is declared: install the requirements, build nothing
                spec = f"{static.name}=={static.version} (metadata only)"
                for req in static.requirements:
                    index_requirement(req, f"{name}'s dependencies")
                reqs = [*static.requirements, *deps.requirements]
                failed = install(venv, reqs, f"the dependencies of {name}") if reqs else None
                if failed is not None:
                    raise _not_installable(name, failed, " (its declared dependencies)")
                write_dist_info(site_packages(venv), static)
            else:
                spec = _install_by_build(root, venv, deps, name, install_project, target.parent, warnings)
            own = {canonical(name)} | ({canonical(static.name)} if static else set())
            frozen = [
                r for r in freeze(venv) if canonical(re.split(r"[=@ <>!~;\[]", r, maxsplit=1)[0]) not in own
            ]
            record = Venv(
                path=target,
                key=key,
                deps=[spec, *deps.requirements],
                sources=deps.sources,
                freeze=frozen,
                warnings=warnings,
                seconds=time.monotonic() - start,
            )
            (venv / "vriksha-venv.json").write_text(json.dumps(record.to_json(), indent=1))
            venv.rename(target)
        for w in warnings:
            logger.warning("%s: %s", name, w)
        logger.info(
            "bootstrapped %s in %.1f s (%s)",
            name,
            record.seconds,
            ", ".join(deps.sources) or "no test extras",
        )
        return record
