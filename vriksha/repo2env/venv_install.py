"""Install packages into a project's venv without ever starting that venv's interpreter on the host.

A venv's interpreter runs, at start-up, whatever its site-packages tell it to (a `.pth` file that a
wheel of the project, or of a dependency, put there). So it starts only inside the sandbox, and an
install takes two steps:

1. on the host, with network, this interpreter's pip collects a wheel of every requirement and its
   dependencies into a wheelhouse (`pip wheel`, reusing pip's cache). Only requirements from the
   package index are accepted: a direct URL, VCS or path dependency is refused before pip sees it
   (`index_requirement`), so nothing named by the repository is fetched or built here. (A dependency
   the index publishes only as an sdist is built into a wheel by pip here: code from the index.)
2. in the sandbox, network off, the venv's own interpreter runs this pip (bound read-only) to install
   from the wheelhouse alone (`--no-index`). Installing a wheel runs none of its code; whatever the
   venv's `.pth` files run, runs there.

The venv lives in a directory of its own (`venv_box`), which is the sandbox's work directory for
step 2. Listing what is installed and deleting a distribution's files read metadata on the host.
"""

from __future__ import annotations

import email.parser
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from vriksha.repo2env.errors import BootstrapError

logger = logging.getLogger(__name__)

__all__ = [
    "index_requirement",
    "index_requirements",
    "wheel_requirements",
    "venv_box",
    "install",
    "installed",
    "freeze",
    "strip_distribution",
    "site_packages",
    "copy_host_dists",
]

INSTALL_TIMEOUT_S = 900.0
_NOT_FROZEN = {"pip", "setuptools", "wheel", "distribute"}  # what `pip freeze` leaves out


def index_requirement(text: str, what: str) -> Requirement:
    """`text` as a requirement on an index package; `BootstrapError` for a URL, VCS or path dependency
    (or anything that is not a requirement, such as a pip option)."""
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise BootstrapError(
            f"{what}: {text!r} is not a requirement on a package of the index ({exc}); repo2env installs "
            "dependencies by name from the package index only (a path, a URL or a pip option would be "
            "fetched or built outside the sandbox): depend on a published package by name"
        ) from None
    if req.url:
        raise BootstrapError(
            f"{what}: {text!r} is a direct URL or path dependency; repo2env refuses those (they would be "
            "fetched and built outside the sandbox, with network): publish it to an index "
            "(PIP_INDEX_URL, PIP_FIND_LINKS) and depend on it by name"
        )
    return req


def index_requirements(reqs: list[str], what: str) -> tuple[list[str], list[str]]:
    """(the index requirements among `reqs`, a warning for each one refused)."""
    kept, refused = [], []
    for text in reqs:
        try:
            index_requirement(text, what)
            kept.append(text)
        except BootstrapError as exc:
            refused.append(f"{exc}; left out")
    return kept, refused


def wheel_requirements(wheel: Path, extras: list[str]) -> list[str]:
    """The Requires-Dist of `wheel` that apply with `extras` (read from its METADATA, nothing run);
    `BootstrapError` for a URL or path dependency among them."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BootstrapError(f"{wheel.name}: not a wheel ({exc}); the build made no valid wheel") from None
    with zf:
        names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise BootstrapError(
                f"{wheel.name}: no single .dist-info/METADATA; the build made no valid wheel"
            )
        text = zf.read(names[0]).decode("utf-8", "replace")
    message = email.parser.Parser().parsestr(text, headersonly=True)
    out = []
    envs = [{"extra": e} for e in ["", *extras]]
    for raw in message.get_all("Requires-Dist") or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            req = index_requirement(raw, f"{wheel.name} (Requires-Dist)")  # raises, naming it
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            index_requirement(raw, f"{wheel.name} (Requires-Dist)")
            out.append(raw)
    return out


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise BootstrapError(f"{venv}: no lib/python3*/site-packages; recreate the venv")
    return found[0]


def installed(venv: Path) -> dict[str, metadata.Distribution]:
    """The venv's distributions by canonical name (their metadata files read; nothing run)."""
    return {
        canonicalize_name(d.metadata["Name"] or ""): d
        for d in metadata.distributions(path=[str(site_packages(venv))])
        if d.metadata["Name"]
    }


def freeze(venv: Path) -> list[str]:
    """`pip freeze` of the venv, from its metadata: NAME==VERSION, sorted."""
    dists = installed(venv)
    return sorted(
        (f"{d.metadata['Name']}=={d.version}" for k, d in dists.items() if k not in _NOT_FROZEN),
        key=str.lower,
    )


def strip_distribution(venv: Path, name: str) -> list[str]:
    """Delete the installed code of `name` from the venv, keeping its .dist-info; warnings for what
    could not be deleted. Every path comes from the wheel's RECORD: only those inside the venv go."""
    dist = installed(venv).get(canonicalize_name(name))
    if dist is None:
        return []
    root = os.path.realpath(venv)
    warnings: list[str] = []
    dirs: set[str] = set()
    for f in dist.files or []:
        if ".dist-info" in str(f) or ".egg-info" in str(f) or str(f).startswith(".."):
            continue  # metadata, and what is not code under site-packages (scripts, data), stay
        path = Path(dist.locate_file(f))
        parent = os.path.realpath(path.parent)
        if not (parent == root or parent.startswith(root + os.sep)):
            warnings.append(f"{name}: its RECORD names {str(f)!r}, outside the venv: left alone")
            continue
        target = Path(parent) / path.name
        if target.is_symlink() or target.is_file():
            target.unlink()
        dirs.add(parent)
    for d in sorted(dirs, key=lambda p: -p.count(os.sep)):
        if os.path.basename(d) == "__pycache__":
            shutil.rmtree(d, ignore_errors=True)
        if d != root:
            try:
                os.rmdir(d)
            except OSError:
                pass
    return warnings


@contextmanager
def venv_box(parent: Path, prefix: str) -> Iterator[Path]:
    """A private directory under `parent` holding only `venv` (the sandbox's work directory while
    installing into it); yields the venv's path. The caller moves the venv out; the rest goes."""
    parent.mkdir(parents=True, exist_ok=True)
    box = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield box / "venv"
    finally:
        shutil.rmtree(box, ignore_errors=True)


def _satisfied(venv: Path, reqs: list[str]) -> set[str]:
    """The requirements already met by the venv (plain ones: no extras)."""
    have = installed(venv)
    done = set()
    for text in reqs:
        req = Requirement(text)
        dist = have.get(canonicalize_name(req.name))
        if dist is not None and not req.extras and req.specifier.contains(dist.version, prereleases=True):
            done.add(text)
    return done


def _fetch(reqs: list[str], wheelhouse: Path, what: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheelhouse), *reqs]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise BootstrapError(
            f"collecting {what} took more than {INSTALL_TIMEOUT_S:.0f} s; check the network or the index"
        ) from exc


def _install_in_sandbox(venv: Path, wheelhouse: Path, reqs: list[str], what: str) -> None:
    import pip

    from vriksha.envs.sandbox import run_sandboxed

    pip_dir = Path(pip.__file__).resolve().parent
    argv = [str(venv / "bin" / "python"), str(pip_dir / "__pip-runner__.py"), "install", "-q"]
    argv += ["--no-index", "--find-links", str(wheelhouse), "--no-cache-dir", "--disable-pip-version-check"]
    res = run_sandboxed(
        ["/bin/sh", "-c", f"exec {shlex.join([*argv, *reqs])}"],
        cwd=venv.parent,
        timeout_s=INSTALL_TIMEOUT_S,
        memory_mb=4096,
        max_procs=64,
        max_file_mb=2048,
        env={"PIP_CONFIG_FILE": os.devnull, "PYTHONDONTWRITEBYTECODE": "1"},
        ro_paths=[pip_dir],
    )
    if res.timed_out or res.exit_code != 0:
        why = "timed out" if res.timed_out else f"exited with {res.exit_code}"
        raise BootstrapError(
            f"cannot install {what} into its venv (pip, in the sandbox, {why}): "
            f"{(res.stderr or res.stdout).strip()[-2000:]}"
        )


def install(venv: Path, reqs: list[str], what: str) -> subprocess.CompletedProcess | None:
    """Install the index requirements `reqs` (wheel paths allowed) into `venv`, which sits alone in its
    `venv_box`. Returns pip's failed collection (for the caller's message or fallback), else None."""
    plain = [r for r in reqs if not r.split("[", 1)[0].endswith(".whl")]
    for text in plain:
        index_requirement(text, what)
    todo = [r for r in reqs if r not in _satisfied(venv, plain)]
    if not todo:
        return None
    wheelhouse = venv.parent / ".wheels"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir()
    try:
        proc = _fetch(todo, wheelhouse, what)
        if proc.returncode:
            return proc
        local = []
        for r in todo:  # a wheel file given by path is installed from its copy in the wheelhouse
            path, bracket, extras = r.partition("[")
            local.append(str(wheelhouse / Path(path).name) + bracket + extras if path.endswith(".whl") else r)
        _install_in_sandbox(venv, wheelhouse, local, what)
    finally:
        shutil.rmtree(wheelhouse, ignore_errors=True)
    return None


def copy_host_dists(venv: Path, names: list[str]) -> bool:
    """Offline fallback: copy this interpreter's installed distributions (and what they require) into
    the venv's site-packages (files only; nothing run)."""
    try:
        site = site_packages(venv)
    except BootstrapError:
        return False
    todo, done = list(names), set()
    try:
        while todo:
            name = todo.pop()
            key = canonicalize_name(name)
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
