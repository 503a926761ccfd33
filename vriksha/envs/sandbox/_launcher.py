"""The sandbox launcher: run as a script (`python -I -S _launcher.py CONFIG CMD...`), stdlib only.

1. `unshare` new mount, PID, IPC, UTS and (unless allowed) network namespaces; as non-root inside a
   user namespace that maps only the caller's own uid and gid. When the platform refuses, it falls
   back to the network alone, then to nothing, and says what it got.
2. `fork`: the child is PID 1 of the new PID namespace. It builds a fresh root (`rootfs.build`: the
   work directory, the read-only interpreter and standard library, read-only system libraries,
   a fresh /proc, private /tmp and /dev) and `pivot_root`s into it; it dies with the launcher.
   Then it installs the system-call filter (`_seccomp.py`: no nested user namespaces, no
   io_uring), which everything it starts inherits.
3. It forks the command, which sets its rlimits, drops to the sandbox uid (as root) and `exec`s.
   When the command exits, PID 1 reports its status and exits, and the kernel kills every process
   left in the namespace (daemons, fork-bomb leftovers).

The status pipe gets one JSON line after set-up and one with the command's exit status.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _rootfs as rootfs  # noqa: E402  (a sibling script, stdlib only)
import _seccomp as seccomp  # noqa: E402

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG = 1


def _write_id_maps(uid: int, gid: int) -> bool:
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
        return True
    except OSError:
        return False


def _unshare(libc, cfg: dict) -> int:
    """The namespaces obtained, as CLONE_* flags (0: none)."""
    if cfg.get("simulate_no_namespaces"):
        return 0
    net = 0 if cfg["allow_network"] else CLONE_NEWNET
    full = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | net
    uid, gid = os.getuid(), os.getgid()
    attempts = [full] if os.geteuid() == 0 else []
    attempts += [full | CLONE_NEWUSER]
    if net:
        attempts += [net] if os.geteuid() == 0 else []
        attempts += [net | CLONE_NEWUSER]
    for flags in attempts:
        if libc.unshare(flags) == 0:
            if flags & CLONE_NEWUSER and not _write_id_maps(uid, gid):
                return 0  # a user namespace without a mapping is useless; nothing else was unshared
            return flags
    return 0


def _set_limits(cfg: dict, status: dict) -> None:
    for name, soft in cfg["rlimits"].items():
        try:
            hard = soft + 1 if name == "RLIMIT_CPU" else soft
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError) as exc:
            status["error"] = f"setrlimit {name}: {exc}"


def _exec(cfg: dict, cmd: list[str]) -> None:
    """In the process that becomes the command: limits, uid, exec (never returns)."""
    status: dict = {}
    try:
        os.chdir(cfg["workdir"])
        _set_limits(cfg, status)
        if cfg["drop_uid"]:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        os.execvpe(cmd[0], cmd, os.environ)
    except OSError as exc:
        os.write(2, f"sandbox: cannot execute {cmd[0]!r}: {exc}\n".encode())
    os._exit(127)


def _report(fd: int, record: dict) -> None:
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    except OSError:
        pass


def _filter(libc, status: dict) -> None:
    """Install the system-call filter here, before anything untrusted runs; say whether it took."""
    why = seccomp.install(libc)
    status["seccomp"] = why is None
    if why is not None:
        status["seccomp_error"] = why


def _init(libc, cfg: dict, cmd: list[str], flags: int, status: dict) -> None:
    """PID 1 of the sandbox: build the root, start the command, wait for it, report (never returns)."""
    fd = cfg["status_fd"]
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    code = 0
    try:
        if flags & CLONE_NEWNS:
            rootfs.build(libc, cfg)
            status["filesystem_isolated"] = True
        status["pid_isolated"] = bool(flags & CLONE_NEWPID)
        _filter(libc, status)
        os.set_inheritable(fd, False)
        _report(fd, status)
        child = os.fork()
        if child == 0:
            _exec(cfg, cmd)
        while True:  # reap everything; stop when the command itself is done
            try:
                pid, wstatus = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == child:
                if os.WIFSIGNALED(wstatus):
                    _report(fd, {"signal": os.WTERMSIG(wstatus)})
                    code = 128 + os.WTERMSIG(wstatus)
                else:
                    code = os.waitstatus_to_exitcode(wstatus)
                    _report(fd, {"exit": code})
                break
    except BaseException as exc:  # set-up failed: say so and never run the command half-contained
        status["setup_error"] = f"{type(exc).__name__}: {exc}"
        _report(fd, status)
        os.write(2, f"sandbox: set-up failed: {status['setup_error']}\n".encode())
        code = 126
    os._exit(code)


def main() -> None:
    import warnings  # noqa: F401  (os.execvpe imports it lazily, maybe after the interpreter is hidden)

    cfg = json.loads(sys.argv[1])
    cmd = sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _unshare(libc, cfg)
    status = {
        "network_isolated": bool(flags & CLONE_NEWNET),
        "user_namespace": bool(flags & CLONE_NEWUSER),
        "pid_isolated": False,
        "filesystem_isolated": False,
        "seccomp": False,
        "error": None,
    }
    # without a private root a fresh uid may not reach an interpreter under a private home (/root/.pyenv)
    cfg["drop_uid"] = cfg["uid"] is not None and os.geteuid() == 0
    cfg["drop_uid"] &= bool(flags & CLONE_NEWNS) or cfg["python_world_executable"]
    status["uid_dropped"] = cfg["drop_uid"]
    if not flags & CLONE_NEWPID:  # no PID namespace: run the command from here, as before
        _filter(libc, status)
        fd = cfg["status_fd"]
        os.set_inheritable(fd, False)
        _report(fd, status)
        os.close(fd)
        _exec(cfg, cmd)
    pid = os.fork()
    if pid == 0:
        _init(libc, cfg, cmd, flags, status)
    os.close(cfg["status_fd"])
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    _, wstatus = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(wstatus) if os.WIFEXITED(wstatus) else 128 + os.WTERMSIG(wstatus))


if __name__ == "__main__":
    main()
