"""Run untrusted code (model output, repository tests) in a contained child process.

`run_sandboxed(cmd, ...)` starts a small launcher (this file run as a script, stdlib only) that,
before it `exec`s the command:
- cuts the network off with a fresh network namespace (`unshare(CLONE_NEWNET)`; as non-root via a
  user namespace), reporting `network_isolated=False` when the platform refuses;
- as root: gives the child a private mount namespace with fresh tmpfs on /tmp, /var/tmp and
  /dev/shm (the working directory is bound back in), and drops to a fresh unprivileged uid so the
  process-count limit applies (Linux ignores RLIMIT_NPROC for root), the rest of the file system
  is read-only to it, and every process it leaves behind can be found and killed;
- sets rlimits: CPU seconds, address space, processes, file size, no core files;
- starts a new session (process group) with a scrubbed environment in a private working directory.

On timeout the whole process group (and, as root, every process of the sandbox uid) is killed.
Output is truncated to `max_output_bytes` per stream with a marker. The result says which limit
was hit (timeout, cpu, memory, processes, file_size) as far as it can be told from the outside.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def _launch() -> None:  # runs in the child, before exec; stdlib only
    import warnings  # noqa: F401  (os.execvpe imports it lazily, maybe after the interpreter is hidden)

    cfg = json.loads(sys.argv[1])
    cmd = sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    status = {"network_isolated": False, "mount_isolated": False, "uid": os.getuid(), "error": None}
    root = os.geteuid() == 0
    flags = 0 if cfg["allow_network"] else _CLONE_NEWNET
    if root:
        flags |= _CLONE_NEWNS
    if flags and libc.unshare(flags) != 0 and root:
        flags &= ~_CLONE_NEWNS  # mount namespaces refused: try the network alone
        if flags and libc.unshare(flags) != 0:
            flags = 0
    if flags == 0 and not cfg["allow_network"] and not root:
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
            flags = _CLONE_NEWNET
    status["network_isolated"] = bool(flags & _CLONE_NEWNET)
    if flags & _CLONE_NEWNS:
        status["mount_isolated"] = _private_mounts(libc, cfg["workdir"], cfg["tmpfs_mb"], cfg["expose"])
    os.chdir(cfg["workdir"])
    for name, soft in cfg["rlimits"].items():
        res = getattr(resource, name)
        try:
            resource.setrlimit(res, (soft, soft if name != "RLIMIT_CPU" else soft + 1))
        except (ValueError, OSError) as exc:
            status["error"] = f"setrlimit {name}: {exc}"
    if root and cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        status["uid"] = cfg["uid"]
    fd = cfg["status_fd"]
    os.write(fd, json.dumps(status).encode())
    os.close(fd)
    try:
        os.execvpe(cmd[0], cmd, os.environ)
    except OSError as exc:
        os.write(2, f"sandbox: cannot execute {cmd[0]!r}: {exc}\n".encode())
        os._exit(127)


def _private_mounts(libc: ctypes.CDLL, workdir: str, tmpfs_mb: int, expose: list[str]) -> bool:
    """Fresh tmpfs on the shared writable dirs; `workdir` and `expose` (read-only) bound back in.

    A path in `expose` under a directory others cannot enter (a Python under /root/.pyenv) gets
    that directory replaced by a tmpfs holding only the exposed path, which also hides the rest.
    """
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    keep = {workdir: os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)}
    hide = set()
    for path in expose:
        parts = os.path.abspath(path).split("/")[1:]
        for i in range(1, len(parts)):
            anc = "/" + "/".join(parts[:i])
            if not os.stat(anc).st_mode & 0o001:
                hide.add(anc)
                keep[path] = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                break
    opts = f"size={tmpfs_mb}m,mode=1777".encode()
    for path in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(path) and libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, opts) != 0:
            return False
    for path in sorted(hide):
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, b"size=1m,mode=755") != 0:
            return False
    ok = True
    for path, fd in keep.items():
        os.makedirs(path, exist_ok=True)  # the path may now lie in a fresh tmpfs: bind the real one back
        ok &= libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC, None) == 0
        if path != workdir:
            libc.mount(None, path.encode(), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None)
        os.close(fd)
    return ok


if __name__ == "__main__":
    _launch()


# ---------------------------------------------------------------- the parent side

import logging  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from vriksha.envs.core import phase  # noqa: E402
from vriksha.errors import VrikshaError  # noqa: E402

logger = logging.getLogger(__name__)

__all__ = ["SandboxResult", "SandboxError", "run_sandboxed", "TRUNCATION_MARKER"]

TRUNCATION_MARKER = "\n...[truncated {n} bytes]\n"
_SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(VrikshaError, ValueError):
    """The sandbox was asked for something it cannot do (bad file path, empty command)."""


@dataclass(slots=True)
class SandboxResult:
    exit_code: int | None  # negative: killed by that signal
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    limit_hit: str | None = None  # timeout | cpu | memory | processes | file_size
    network_isolated: bool = False
    truncated: bool = False
    isolation: dict[str, bool] = field(default_factory=dict)  # network, mounts, user, process_limit
    files: dict[str, bytes] = field(default_factory=dict)  # the `collect`ed output files

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["files"] = {k: v.decode("utf-8", "replace") for k, v in self.files.items()}
        return d


class _Drain(threading.Thread):
    """Reads a pipe to EOF, keeping the first `limit` bytes and counting the rest."""

    def __init__(self, stream, limit: int):
        super().__init__(daemon=True)
        self.stream, self.limit, self.buf, self.dropped = stream, limit, bytearray(), 0
        self.start()

    def run(self) -> None:
        while chunk := self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536):
            room = self.limit - len(self.buf)
            if room > 0:
                self.buf += chunk[:room]
            self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        out = self.buf.decode("utf-8", "replace")
        return out + TRUNCATION_MARKER.format(n=self.dropped) if self.dropped else out


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


def _classify(code: int | None, stderr: str, timed_out: bool, cpu_s: float, duration_s: float) -> str | None:
    if timed_out:
        return "timeout"
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and duration_s >= cpu_s):  # soft, then hard limit
        return "cpu"
    if code == -signal.SIGXFSZ or "File too large" in stderr:
        return "file_size"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr or "std::bad_alloc" in stderr:
        return "memory"
    if "Resource temporarily unavailable" in stderr or "BlockingIOError" in stderr and "fork" in stderr:
        return "processes"
    return None


def run_sandboxed(
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
) -> SandboxResult:
    """Run `cmd` contained; see the module docstring for what is isolated and how.

    `files` are written into the working directory first (a private temp dir, removed afterwards,
    unless `cwd` is given). `collect` names files to read back from it after the run.
    """
    with phase("env.sandbox"):
        return _run(**locals())


def _run(
    cmd: list[str],
    files: dict[str, str | bytes] | None,
    cwd: Path | str | None,
    timeout_s: float,
    cpu_s: float | None,
    memory_mb: int,
    max_procs: int,
    max_file_mb: int,
    allow_network: bool,
    env: dict[str, str] | None,
    stdin: str | bytes | None,
    max_output_bytes: int,
    collect: list[str] | None,
) -> SandboxResult:
    if not cmd:
        raise SandboxError("run_sandboxed needs a non-empty command list")
    own_dir = cwd is None
    workdir = Path(tempfile.mkdtemp(prefix="vriksha-sbx-")) if own_dir else Path(cwd).resolve()
    root = os.geteuid() == 0
    uid = _fresh_uid() if root else None
    cpu_limit = int(cpu_s if cpu_s is not None else max(1, timeout_s)) or 1
    rlimits = {
        "RLIMIT_CPU": cpu_limit,
        "RLIMIT_AS": memory_mb * 1024 * 1024,
        "RLIMIT_FSIZE": max_file_mb * 1024 * 1024,
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": max_procs,
    }
    if not root:  # NPROC counts all of this user's processes: allow the existing ones on top
        rlimits["RLIMIT_NPROC"] = max_procs + _count_user_procs(os.getuid())
    child_env = {
        "PATH": f"{Path(sys.executable).parent}:{_SAFE_PATH}",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": "0",
    }
    child_env.update(env or {})
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
            "expose": sorted({sys.base_prefix, sys.prefix}),
        }
        launcher = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), json.dumps(cfg), *cmd]
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
        out, err = _Drain(proc.stdout, max_output_bytes), _Drain(proc.stderr, max_output_bytes)
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
        stderr = err.text()
        code = proc.returncode
        result = SandboxResult(
            exit_code=code,
            stdout=out.text(),
            stderr=stderr,
            duration_s=duration,
            timed_out=timed_out,
            limit_hit=_classify(code, stderr, timed_out, cpu_limit, duration),
            network_isolated=bool(status.get("network_isolated")) and not allow_network,
            truncated=bool(out.dropped or err.dropped),
            isolation={
                "network": bool(status.get("network_isolated")),
                "mounts": bool(status.get("mount_isolated")),
                "user": uid is not None and status.get("uid") == uid,
                "process_limit": True,
            },
        )
        if not result.network_isolated and not allow_network:
            logger.warning("sandbox: the network could not be cut off on this platform (unshare refused)")
        for rel in collect or []:
            path = (workdir / rel).resolve()
            if path.is_relative_to(workdir.resolve()) and path.is_file():
                result.files[rel] = path.read_bytes()[: max_output_bytes * 16]
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
    chunks = []
    while data := os.read(fd, 65536):
        chunks.append(data)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except json.JSONDecodeError:
        return {}


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
