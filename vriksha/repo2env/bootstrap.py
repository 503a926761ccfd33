"""One isolated virtual environment per project, cached by content hash: the dependency bootstrap, its
own step (with network; no test runs here; for a project with static metadata no repository code at
all, `static_install.py`; for one without, its build code runs only in the sandbox, `sandboxed_build.py`).

The venv is made with `python -m venv --without-pip` (no system site-packages) from a cached seed
venv that already holds pytest; the host's pip installs into it (`pip --python`), so its wheel
cache is reused. The project is installed with its declared test dependencies, then its own code is
removed from site-packages again (its metadata stays): tests import the workspace copy through
PYTHONPATH, and the venv holds no copy of the code a task removes.
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
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vriksha.repo2env.deps import TestDeps, declared_test_deps
from vriksha.repo2env.errors import BootstrapError
from vriksha.repo2env.sandboxed_build import build_wheel_sandboxed
from vriksha.repo2env.static_install import canonical, static_project, write_dist_info

logger = logging.getLogger(__name__)

__all__ = ["Venv", "bootstrap", "cache_root", "BOOTSTRAP_VERSION", "copy_venv"]

BOOTSTRAP_VERSION = "1"
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


def _run(cmd: list[str], what: str, timeout: float = 900) -> subprocess.CompletedProcess:
    logger.debug("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BootstrapError(
            f"{what} took more than {timeout:.0f} s; check the network or the package index"
        ) from exc
    return proc


def _pip(python: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(python), *args]


def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "w")  # noqa: SIM115
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def _seed() -> Path:
    """A venv with pytest installed, made once per Python version and copied for each project."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-v{BOOTSTRAP_VERSION}"
    seed = cache_root() / f"seed-{tag}"
    with _lock(cache_root() / f"seed-{tag}.lock"):
        if (seed / "ready").exists():
            return seed
        shutil.rmtree(seed, ignore_errors=True)
        proc = _run([sys.executable, "-m", "venv", "--without-pip", str(seed)], "creating the seed venv")
        if proc.returncode:
            raise BootstrapError(f"python -m venv failed: {proc.stderr.strip()[-2000:]}")
        proc = _run(_pip(seed / "bin" / "python", "install", "-q", *SEED_PACKAGES), "installing pytest")
        if proc.returncode and _copy_host_dists(seed, SEED_PACKAGES):
            logger.warning(
                "the package index is unreachable: the seed venv got a copy of this interpreter's pytest"
            )
        elif proc.returncode:
            raise BootstrapError(
                f"cannot install {SEED_PACKAGES} into the seed venv: {proc.stderr.strip()[-2000:]}; "
                "check that the package index (or a wheel cache) is reachable"
            )
        (seed / "ready").write_text("ok")
    return seed


def _copy_host_dists(venv: Path, names: list[str]) -> bool:
    """Offline fallback: copy installed distributions (and what they require) into the venv's site-packages."""
    from importlib import metadata

    from packaging.requirements import Requirement

    site = next((venv / "lib").glob("python3*/site-packages"), None)
    if site is None:
        return False
    todo, done = list(names), set()
    try:
        while todo:
            name = todo.pop()
            key = name.lower().replace("_", "-")
            if key in done:
                continue
            done.add(key)
            dist = metadata.distribution(name)
            for f in dist.files or []:
                src = Path(dist.locate_file(f))
                if str(f).startswith("..") or "__pycache__" in f.parts or not src.is_file():
                    continue
                dst = site / f
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
            for req in dist.requires or []:
                r = Requirement(req)
                if r.marker is None or r.marker.evaluate({"extra": ""}):
                    todo.append(r.name)
    except (metadata.PackageNotFoundError, OSError) as exc:
        logger.warning("cannot copy the host's %s into the venv: %s", names, exc)
        return False
    return True


def copy_venv(src: Path, dst: Path) -> None:
    """Copy a venv (symlinks kept; always call its python with -m, so script shebangs do not matter)."""
    shutil.copytree(src, dst, symlinks=True)  # keep the bytecode: tests run with PYTHONDONTWRITEBYTECODE


def _strip_project(python: Path, name: str) -> list[str]:
    """Delete the installed copy of the project's code, keeping its .dist-info metadata."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "try:\n d = m.distribution(sys.argv[1])\nexcept m.PackageNotFoundError:\n print('[]'); raise SystemExit\n"
        "out = []\n"
        "for f in d.files or []:\n"
        "  p = f.locate()\n"
        "  if '.dist-info' in str(f) or '.egg-info' in str(f): continue\n"
        "  if str(f).startswith('..'): continue\n"
        "  out.append(str(p))\n"
        "print(json.dumps(out))\n"
    )
    proc = _run([str(python), "-c", code, name], "listing the installed project files", timeout=60)
    try:
        files = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return [f"could not list the installed files of {name}: {proc.stderr.strip()[-500:]}"]
    dirs = set()
    for f in files:
        p = Path(f)
        p.unlink(missing_ok=True)
        dirs.add(p.parent)
    for d in sorted(dirs, key=lambda p: -len(p.parts)):
        if d.name == "__pycache__":
            shutil.rmtree(d, ignore_errors=True)
        try:
            d.rmdir()
        except OSError:
            pass
    return []


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


def _install(python: Path, reqs: list[str], name: str, tmp: Path, warnings: list[str]) -> None:
    if not reqs:
        return
    proc = _run(_pip(python, "install", "-q", *reqs), f"installing the dependencies of {name}")
    if proc.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BootstrapError(
            f"cannot install {name} (its declared dependencies) into its venv: {proc.stderr.strip()[-2000:]}; "
            "the project must be pip-installable (pure Python) with its dependencies on the index"
        )


def _pip_install(python: Path, reqs: list[str], what: str) -> None:
    """Install index packages into the venv of `python`; offline, copy this interpreter's own copies."""
    proc = _run(_pip(python, "install", "-q", *reqs), f"installing {what}")
    if proc.returncode == 0:
        return
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        names = [Requirement(r).name for r in reqs]
    except InvalidRequirement as exc:
        raise BootstrapError(f"{what}: {exc}; fix the requirement in the project's pyproject.toml") from exc
    if _copy_host_dists(python.parent.parent, names):
        logger.warning("the package index is unreachable: %s copied from this interpreter", what)
        return
    raise BootstrapError(f"cannot install {what} ({' '.join(reqs)}): {proc.stderr.strip()[-2000:]}")


def _install_by_build(
    root: Path,
    python: Path,
    deps: TestDeps,
    name: str,
    tmp: Path,
    install_project: bool,
    scratch: Path,
    warnings: list[str],
) -> str:
    """The project is built into a wheel in the sandbox (`sandboxed_build.py`); pip installs that wheel and
    its dependencies from the index (no repository code runs on the host), then its code is removed."""
    install_project = install_project and _needs_install(root, deps)
    spec = ""
    try:
        if install_project:
            wheel = build_wheel_sandboxed(root, scratch, _seed(), _pip_install)
            spec = str(wheel) + (f"[{','.join(deps.extras)}]" if deps.extras else "")
        args = ["install", "-q"] + ([spec] if spec else []) + deps.requirements
        if len(args) > 2:
            proc = _run(_pip(python, *args), f"installing {name} and its test dependencies")
            if proc.returncode and deps.requirements and spec:
                warnings.append(
                    f"installing the declared test requirements failed ({proc.stderr.strip()[-300:]}); "
                    "retried with the project alone"
                )
                proc = _run(_pip(python, "install", "-q", spec), f"installing {name}")
            if proc.returncode:
                raise BootstrapError(
                    f"cannot install {name} into its venv: {proc.stderr.strip()[-2000:]}; "
                    "the project must be pip-installable (pure Python) with its dependencies on the index"
                )
    except BootstrapError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if spec:
            Path(spec.split("[", 1)[0]).unlink(missing_ok=True)
    if install_project:
        warnings += _strip_project(python, name)
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
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=target.parent))
        shutil.rmtree(tmp)
        copy_venv(seed, tmp)
        python = tmp / "bin" / "python"
        deps: TestDeps = declared_test_deps(root)
        warnings: list[str] = []
        static = static_project(root, deps.extras) if install_project else None
        if static is not None:  # everything is declared: install the requirements, build nothing
            spec = f"{static.name}=={static.version} (metadata only)"
            _install(python, [*static.requirements, *deps.requirements], name, tmp, warnings)
            site = next((tmp / "lib").glob("python3*/site-packages"))
            write_dist_info(site, static)
        else:
            spec = _install_by_build(root, python, deps, name, tmp, install_project, target.parent, warnings)
        freeze = _run(_pip(python, "freeze", "--exclude-editable"), "pip freeze").stdout.splitlines()
        own = {canonical(name)} | ({canonical(static.name)} if static else set())
        freeze = [r for r in freeze if canonical(re.split(r"[=@ <>!~;\[]", r, maxsplit=1)[0]) not in own]
        venv = Venv(
            path=target,
            key=key,
            deps=[spec, *deps.requirements],
            sources=deps.sources,
            freeze=freeze,
            warnings=warnings,
            seconds=time.monotonic() - start,
        )
        (tmp / "vriksha-venv.json").write_text(json.dumps(venv.to_json(), indent=1))
        tmp.rename(target)
        logger.info(
            "bootstrapped %s in %.1f s (%s)", name, venv.seconds, ", ".join(deps.sources) or "no test extras"
        )
        return venv
