"""`run_sandboxed`: start the launcher (`_launcher.py`) on a command and collect what it did.

The parent writes the files into a private work directory, picks a fresh unprivileged uid (as
root), starts the launcher in a new session with a scrubbed environment, drains stdout and stderr
(truncated with a marker), kills everything on timeout and reads the launcher's status: which
namespaces it got and how the command ended.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec

from vriksha.envs.core import phase
from vriksha.envs.sandbox.errors import SandboxError, SandboxUnavailableError
from vriksha.envs.sandbox.interpreter import root_spec
from vriksha.envs.sandbox.result import Drain, SandboxResult, classify, missing_protections

logger = logging.getLogger(__name__)
P = ParamSpec("P")

__all__ = ["run_sandboxed", "read_output", "SIMULATE_NO_NAMESPACES_ENV"]

_SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCHER = Path(__file__).resolve().parent / "_launcher.py"
# For tests of the fallback: the launcher behaves as on a machine that allows no namespaces.
SIMULATE_NO_NAMESPACES_ENV = "VRIKSHA_SANDBOX_SIMULATE_NO_NAMESPACES"

_uid_counter = 0
_uid_lock = threading.Lock()


def _fresh_uid() -> int:
    global _uid_counter
    with _uid_lock:
        _uid_counter += 1
        n = _uid_counter
    return 200_000 + (os.getpid() * 7919 + n * 104_729 + time.monotonic_ns()) % 1_000_000


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid` (also those that left the process group), from a forked helper."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _write_files(workdir: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = (workdir / rel).resolve()
        if Path(rel).is_absolute() or not path.is_relative_to(workdir.resolve()):
            raise SandboxError(f"sandbox file {rel!r} must be a relative path inside the working directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _chown_tree(root: Path, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def _world_executable(path: str) -> bool:
    """Whether any user may run `path` (every directory above it searchable by others)."""
    parts = Path(path).parts
    dirs_ok = all(os.stat(os.path.join(*parts[:i])).st_mode & 0o001 for i in range(1, len(parts)))
    return dirs_ok and bool(os.stat(path).st_mode & 0o001)


def _interpreter_of(cmd: list[str], python: str) -> list[str]:
    """Name the real base interpreter where the command names this process's own (a venv's bin/python)."""
    own = {sys.executable, os.path.realpath(sys.executable)}
    return [python, *cmd[1:]] if cmd[0] in own or os.path.realpath(cmd[0]) in own else cmd


def run_unchecked(
    cmd: list[str],
    *,
    files: dict[str, str | bytes] | None = None,
    cwd: Path | str | None = None,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    memory_mb: int = 1024,
    max_procs: int = 64,
    max_file_mb: int = 16,
    allow_network: bool = False,
    env: dict[str, str] | None = None,
    stdin: str | bytes | None = None,
    max_output_bytes: int = 64 * 1024,
    collect: list[str] | None = None,
    ro_paths: list[str | Path] | None = None,
) -> SandboxResult:
    """Run `cmd` contained, without the check that the sandbox can isolate (the self-test uses it); see
    `run_sandboxed`, which is this function behind that check, for the options.
    """
    if not cmd:
        raise SandboxError("run_sandboxed needs a non-empty command list")
    spec = root_spec()
    cmd = _interpreter_of(list(cmd), spec.python)
    own_dir = cwd is None
    workdir = Path(tempfile.mkdtemp(prefix="vriksha-sbx-")) if own_dir else Path(cwd).resolve()
    root = os.geteuid() == 0
    uid = _fresh_uid() if root else None
    cpu_limit = int(cpu_s if cpu_s is not None else max(1, timeout_s)) or 1
    rlimits = _rlimits(cpu_limit, memory_mb, max_file_mb, max_procs, root)
    child_env = {**_base_env(spec.python, workdir), **(env or {})}
    status_r, status_w = os.pipe()
    started = time.monotonic()
    proc = None
    try:
        _write_files(workdir, files or {})
        if uid is not None:
            _chown_tree(workdir, uid)
            workdir.chmod(0o700)
        cfg = {
            "allow_network": allow_network,
            "workdir": str(workdir),
            "tmpfs_mb": max(16, max_file_mb * 4),
            "rlimits": rlimits,
            "uid": uid,
            "status_fd": status_w,
            **_root_layout(spec, ro_paths),
        }
        launcher = [sys.executable, "-I", "-S", str(_LAUNCHER), json.dumps(cfg), *cmd]
        proc = subprocess.Popen(
            launcher,
            cwd=str(workdir),
            env=child_env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_w,),
        )
        os.close(status_w)
        status_w = -1
        out, err = Drain(proc.stdout, max_output_bytes), Drain(proc.stderr, max_output_bytes)
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_all(proc, uid)
        proc.wait()
        out.join(timeout=5)
        err.join(timeout=5)
        duration = time.monotonic() - started
        status = _read_status(status_r)
        result = _result(proc.returncode, status, out, err, timed_out, duration, cpu_limit, allow_network)
        if status.get("setup_error"):  # the command never ran: never let that pass for a result
            raise SandboxUnavailableError(
                f"the sandbox could not be set up: {status['setup_error']}; see docs/environments.md, "
                "'Threat model', for what it needs"
            )
        for rel in collect or []:
            data = read_output(workdir, rel, max_output_bytes * 16)
            if data is not None:
                result.files[rel] = data
        return result
    finally:
        if proc is not None and proc.returncode is None:
            _kill_all(proc, uid)
        for fd in (status_r, status_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
        elif uid is not None:
            _chown_tree(workdir, os.getuid())


def _rlimits(cpu_limit: int, memory_mb: int, max_file_mb: int, max_procs: int, root: bool) -> dict[str, int]:
    rlimits = {
        "RLIMIT_CPU": cpu_limit,
        "RLIMIT_AS": memory_mb * 1024 * 1024,
        "RLIMIT_FSIZE": max_file_mb * 1024 * 1024,
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": max_procs,
    }
    if not root:  # NPROC counts all of this user's processes: allow the existing ones on top
        rlimits["RLIMIT_NPROC"] = max_procs + _count_user_procs(os.getuid())
    return rlimits


def _base_env(python: str, workdir: Path) -> dict[str, str]:
    """The child's environment before the caller's `env`: nothing of this process's own."""
    return {
        "PATH": f"{os.path.dirname(python)}:{_SAFE_PATH}",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": "0",
    }


def _root_layout(spec: Any, ro_paths: list[str | Path] | None) -> dict[str, Any]:
    """The launcher's view of the root it builds: system directories, read-only binds, links and masks."""
    return {
        "system_dirs": list(spec.system_dirs),
        "ro_paths": [*spec.ro_paths, *(os.path.realpath(p) for p in ro_paths or [])],
        "links": [list(x) for x in spec.links],
        "masks": list(spec.masks),
        "python_world_executable": _world_executable(spec.python),
        "simulate_no_namespaces": os.environ.get(SIMULATE_NO_NAMESPACES_ENV) == "1",
    }


def _result(
    returncode: int | None,
    status: dict[str, Any],
    out: Drain,
    err: Drain,
    timed_out: bool,
    duration: float,
    cpu_limit: int,
    allow_network: bool,
) -> SandboxResult:
    """The run's result from the launcher's status report (its exit or signal, the isolation it set up)."""
    stderr = err.text()
    code = returncode
    if "signal" in status and not timed_out:
        code = -int(status["signal"])
    elif "exit" in status and not timed_out:
        code = int(status["exit"])
    isolation = {
        "network": bool(status.get("network_isolated")),
        "pid": bool(status.get("pid_isolated")),
        "filesystem": bool(status.get("filesystem_isolated")),
        "user": bool(status.get("uid_dropped"))
        or bool(status.get("user_namespace") and status.get("pid_isolated")),
        "seccomp": bool(status.get("seccomp")),
        "process_limit": True,
    }
    return SandboxResult(
        exit_code=code,
        stdout=out.text(),
        stderr=stderr,
        duration_s=duration,
        timed_out=timed_out,
        limit_hit=classify(code, stderr, timed_out, cpu_limit, duration),
        network_isolated=isolation["network"] and not allow_network,
        truncated=bool(out.dropped or err.dropped),
        isolation=isolation,
        missing=missing_protections(isolation, allow_network),
    )


def _checked(run: Callable[P, SandboxResult]) -> Callable[P, SandboxResult]:
    """`run` behind the check that the sandbox can isolate here (or that the user opted out of isolation)."""

    def run_sandboxed(*args: P.args, **kwargs: P.kwargs) -> SandboxResult:
        """Run `cmd` contained; see `vriksha.envs.sandbox` for what is isolated and how.

        `files` are written into the working directory first (a private temp dir, removed afterwards,
        unless `cwd` is given). `ro_paths` are further host paths bound in read-only at their own path
        (a virtualenv the command runs from). `collect` names files to read back from it after the run. Raises
        `SandboxUnavailableError` when the sandbox cannot run here, or cannot isolate and the user has
        not opted in (VRIKSHA_ALLOW_UNSANDBOXED=1).
        """
        from vriksha.envs.sandbox.check import require_sandbox

        require_sandbox(allow_network=bool(kwargs.get("allow_network", False)))
        with phase("env.sandbox"):
            return run(*args, **kwargs)

    run_sandboxed.__signature__ = inspect.signature(run)  # type: ignore[attr-defined]
    return run_sandboxed


run_sandboxed = _checked(run_unchecked)


def _feed(pipe, data: str | bytes) -> None:
    try:
        pipe.write(data.encode() if isinstance(data, str) else data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass


def _kill_all(proc: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        _kill_uid(uid)


def _read_status(fd: int) -> dict:
    """The launcher's JSON lines, merged (set-up first, then how the command ended)."""
    chunks = []
    while data := os.read(fd, 65536):
        chunks.append(data)
    merged: dict = {}
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            merged.update(rec)
    return merged


def read_output(workdir: Path, rel: str, limit: int | None = None) -> bytes | None:
    """A regular file the sandboxed code left at `rel` under its work directory (None if there is none).

    Links are followed only while they stay inside `workdir`: the code may have put a link to a host
    file (read as the caller) where its output was expected."""
    root = Path(workdir).resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return None
    with path.open("rb") as f:
        return f.read(-1 if limit is None else limit)


def _count_user_procs(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n
