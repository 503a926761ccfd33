"""Which interpreter the sandbox runs and which host paths its root holds (read-only).

The interpreter is the real base executable (`sys._base_executable`, symlinks resolved), never a
virtualenv's `bin/python`: a venv's site-packages (which may hold the project and its reference
solutions) stays outside. Its standard library comes from `sysconfig`, its shared libraries from
its LIBDIR; each is bound read-only at its real path, wherever it lives.
"""

from __future__ import annotations

import functools
import glob
import os
import site
import sys
import sysconfig
from dataclasses import dataclass

__all__ = ["RootSpec", "root_spec", "sandbox_python", "SYSTEM_DIRS"]

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SITE_GLOBS = (
    "/usr/lib/python3*/*-packages",
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib/python3*/*-packages",
    "/usr/lib64/python3*/*-packages",
    "/usr/local/lib64/python3*/*-packages",
)
_MAX_LIBS = 256


@dataclass(frozen=True, slots=True)
class RootSpec:
    python: str  # the real base executable
    ro_paths: tuple[str, ...]  # interpreter, stdlib dirs, shared libraries
    links: tuple[tuple[str, str], ...]  # symlinks to recreate (python -> python3.11 ...)
    masks: tuple[str, ...]  # site-packages dirs hidden under an empty tmpfs
    system_dirs: tuple[str, ...] = SYSTEM_DIRS


def _base_executable() -> str:
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


def sandbox_python() -> str:
    """The interpreter to name in a sandboxed command (the real base executable)."""
    return root_spec().python


def _links_to(python: str) -> list[tuple[str, str]]:
    """Symlinks next to (or naming) the interpreter that resolve to it: `python`, `python3`, ..."""
    v = sys.version_info
    bindir = os.path.dirname(python)
    names = {"python", "python3", f"python{v.major}.{v.minor}"}
    candidates = {os.path.join(bindir, n) for n in names}
    base = getattr(sys, "_base_executable", None)
    if base:
        candidates.add(os.path.abspath(base))
    out = []
    for path in sorted(candidates):
        if os.path.islink(path) and os.path.realpath(path) == python:
            out.append((path, os.readlink(path)))
    return out


def _libraries() -> list[str]:
    """The interpreter's own shared libraries (libpython, and a relocatable build's bundled ones)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if not libdir or not os.path.isdir(libdir) or _under_system(os.path.realpath(libdir)):
        return []
    found = sorted(glob.glob(os.path.join(libdir, "*.so*")))[:_MAX_LIBS]
    return sorted({os.path.realpath(p) for p in found} | {p for p in found if not os.path.islink(p)})


def _under_system(path: str) -> bool:
    return _under(path, SYSTEM_DIRS)


def _base_paths() -> dict[str, str]:
    """The base installation's paths: a virtualenv's own lib/pythonX.Y holds only its site-packages."""
    return sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})


def _under(path: str, dirs: tuple[str, ...] | set[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _site_dirs(bound: set[str]) -> list[str]:
    """The site-packages directories the sandbox's root would show (under a bound or system path), to hide;
    a virtualenv's elsewhere is not in the root at all and needs no mount point."""
    dirs = set(site.getsitepackages()) | {site.getusersitepackages()}
    for paths in (sysconfig.get_paths(), _base_paths()):
        dirs |= {paths[k] for k in ("purelib", "platlib")}
    for pattern in _SITE_GLOBS:
        dirs |= set(glob.glob(pattern))
    real = {os.path.realpath(d) for d in dirs if d}
    return sorted(d for d in real if _under_system(d) or _under(d, bound))


@functools.cache
def root_spec() -> RootSpec:
    python = _base_executable()
    paths = _base_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    dynload = os.path.join(os.path.realpath(paths["platstdlib"]), "lib-dynload")
    ro = {python, *stdlib, *_libraries()}
    if os.path.isdir(dynload):
        ro.add(dynload)
    ro = {p for p in ro if os.path.exists(p)}
    return RootSpec(
        python=python,
        ro_paths=tuple(sorted(ro)),
        links=tuple(_links_to(python)),
        masks=tuple(_site_dirs(ro)),
    )
