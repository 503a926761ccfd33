"""Several "nodes" on one machine: processes that share the network (loopback) but each have their own IPC
namespace, their own /dev/shm (a private tmpfs) and their own temporary directory, as separate machines would;
optionally a directory hidden behind a private tmpfs (a node-local path where the others have a share).

Needs root (mount and unshare); the tests that use it skip where the kernel refuses."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def own_node(private_dirs: Sequence[Path] = ()) -> Callable[[], None]:
    """A `preexec_fn`: the child gets new mount and IPC namespaces, a fresh tmpfs on /dev/shm and on each of
    `private_dirs`."""

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        for d in ["/dev/shm", *map(str, private_dirs)]:
            _check(libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0, b"size=256m"), f"mount tmpfs on {d}")

    return enter


def node_env(tmpdir: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment for a trainer process: one OpenMP thread, cached bytecode, its own TMPDIR if given."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tmpdir is not None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmpdir)
    return env


def nodes_unavailable() -> str | None:
    """Why separate nodes cannot be made here, or None when they can."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(len(os.listdir('/dev/shm')))"],
            preexec_fn=own_node(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot give a process its own /dev/shm here ({exc}); needs root"
    if out.returncode != 0 or out.stdout.strip() != "0":
        return f"cannot give a process its own /dev/shm here: {out.stderr[-300:]}"
    return None
