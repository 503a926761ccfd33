"""Build a project that has no static metadata into a wheel, its build code running only in the sandbox.

A project with a `setup.py` or dynamic dependencies says what it needs only by running its own code (the
build backend, `setup.py`). That code is repository code, so it runs where model-written code runs: in
the sandbox, network off, seeing its own copy of the tree and nothing else of the host. The steps
(PEP 517, driven here rather than by pip, which would run the backend on the host):

1. outside, with network: a scratch build venv gets the static `[build-system] requires` from the index
   (setuptools and wheel for a bare `setup.py`); no repository code runs;
2. in the sandbox: the backend's `get_requires_for_build_wheel` names any further build requirements;
3. outside: those are installed into the build venv from the index;
4. in the sandbox: the backend's `build_wheel` writes the wheel.

Installing the wheel then runs no repository code (a wheel is unpacked, never executed), and pip
resolves its declared dependencies from the index.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from vriksha.repo2env.errors import BootstrapError
from vriksha.repo2env.source import copy_tree

logger = logging.getLogger(__name__)

__all__ = ["build_wheel_sandboxed", "build_system", "LEGACY_BACKEND"]

LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
LEGACY_REQUIRES = ["setuptools>=40.8.0", "wheel"]
BUILD_TIMEOUT_S = 600.0

# Run by the build venv's python inside the sandbox: the PEP 517 hook named on the command line.
_HOOK = r"""
import importlib, json, os, sys
hook, backend, backend_path, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
for p in reversed(backend_path):
    sys.path.insert(0, os.path.abspath(p))
module, _, attr = backend.partition(":")
obj = importlib.import_module(module)
for part in filter(None, attr.split(".")):
    obj = getattr(obj, part)
if hook == "requires":
    fn = getattr(obj, "get_requires_for_build_wheel", None)
    result = list(fn({}) if fn else [])
else:
    os.makedirs(out, exist_ok=True)
    result = obj.build_wheel(out, {})
with open(os.path.join(out if hook == "wheel" else ".", ".hook-result.json"), "w") as fh:
    json.dump(result, fh)
"""


def build_system(root: Path) -> tuple[list[str], str, list[str]]:
    """The project's static build requirements, backend and backend path (PEP 517/518 defaults)."""
    data: dict = {}
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(errors="replace"))
        except tomllib.TOMLDecodeError as exc:
            raise BootstrapError(f"{pyproject}: cannot parse ({exc}); fix its TOML to build it") from exc
    system = data.get("build-system") or {}
    if not system.get("build-backend"):
        return [*system.get("requires", LEGACY_REQUIRES)], LEGACY_BACKEND, []
    requires = [r for r in system.get("requires", []) if isinstance(r, str)]
    backend_path = [p for p in system.get("backend-path", []) if isinstance(p, str)]
    return requires, str(system["build-backend"]), backend_path


def _run_hook(
    python: Path, build_venv: Path, tree: Path, hook: str, backend: str, paths: list[str]
) -> object:
    from vriksha.envs.sandbox import read_output, run_sandboxed

    out = "wheel-out"
    # through a shell: a bare python as the command would be swapped for the base interpreter
    argv = shlex.join([str(python), "-c", _HOOK, hook, backend, json.dumps(paths), out])
    res = run_sandboxed(
        ["/bin/sh", "-c", f"exec {argv}"],
        cwd=tree,
        timeout_s=BUILD_TIMEOUT_S,
        memory_mb=4096,
        max_procs=64,
        max_file_mb=256,
        env={"HOME": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "SETUPTOOLS_SCM_PRETEND_VERSION": "0.0.0"},
        ro_paths=[build_venv],
    )
    result = read_output(tree, f"{out}/.hook-result.json" if hook == "wheel" else ".hook-result.json")
    if res.timed_out or res.exit_code != 0 or result is None:
        why = "timed out" if res.timed_out else f"exited with {res.exit_code}"
        raise BootstrapError(
            f"the project's build backend {backend!r} ({hook} hook, in the sandbox, network off) {why}: "
            f"{(res.stderr or res.stdout).strip()[-2000:]}; a project whose build needs the network or "
            "the host cannot become an environment"
        )
    try:
        return json.loads(result.decode("utf-8", "replace"))
    except json.JSONDecodeError as exc:
        raise BootstrapError(
            f"the build backend {backend!r} ({hook} hook) left no valid result: {exc}"
        ) from None


def build_wheel_sandboxed(root: Path, scratch: Path, seed: Path, pip_install) -> Path:
    """Build `root` into a wheel under `scratch` (returned); `pip_install(venv, reqs, what)` installs
    index packages into a venv (`venv_install.install`), `seed` is the venv copied as the build venv."""
    from vriksha.envs.sandbox import read_output
    from vriksha.repo2env.bootstrap import copy_venv

    requires, backend, backend_path = build_system(root)
    work = Path(tempfile.mkdtemp(prefix="sbuild-", dir=scratch))
    build_venv = work / "build" / "venv"  # alone in its directory: the sandbox's work directory for pip
    tree = work / "tree"
    try:
        build_venv.parent.mkdir()
        copy_venv(seed, build_venv)
        copy_tree(root, tree)
        python = build_venv / "bin" / "python"
        if requires:
            pip_install(build_venv, requires, "the build requirements")
        dynamic = _run_hook(python, build_venv, tree, "requires", backend, backend_path)
        if isinstance(dynamic, list) and dynamic:
            pip_install(build_venv, [str(r) for r in dynamic], "the backend's further build requirements")
        name = _run_hook(python, build_venv, tree, "wheel", backend, backend_path)
        wheel = tree / "wheel-out" / str(name)
        written = (
            read_output(tree, f"wheel-out/{name}")
            if isinstance(name, str) and name.endswith(".whl") and "/" not in name
            else None
        )
        if written is None:  # a link out of the tree is no wheel it wrote
            raise BootstrapError(f"the build backend {backend!r} returned {name!r}, not a wheel it wrote")
        kept = scratch / wheel.name
        kept.write_bytes(written)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("built %s in the sandbox (backend %s, %s)", kept.name, backend, sys.version.split()[0])
    return kept
