"""Build the sandbox's root file system and switch into it (stdlib only; run inside the new namespaces).

The root is a fresh tmpfs holding only:
- the system directories (`/usr`, `/bin`, `/lib*`, `/sbin`) read-only, with every Python site-packages
  directory in them masked by an empty read-only tmpfs;
- the interpreter, its standard library and its shared libraries, read-only, at their real paths
  (wherever they live: /tmp, /var/tmp, /dev/shm, a home directory);
- the work directory, writable, at its real path;
- a fresh /proc (this PID namespace's processes only), fresh /tmp, /var/tmp and /dev/shm, a /dev with
  null, zero, full, random and urandom, and a minimal /etc.
Nothing else of the host is mounted, then the root itself is made read-only.
"""

from __future__ import annotations

import ctypes
import os
import platform

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)


class RootfsError(OSError):
    pass


def _mount(libc, src, target: str, fstype, flags: int, data) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise RootfsError(err, f"mount {src} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def _locked_flags(path: str) -> int:
    """The mount flags a read-only remount must keep (a user namespace may not clear them)."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME)):
        if f & st:
            out |= ms
    if f & 2048:
        out |= MS_NODIRATIME
    if f & 4096:
        out |= MS_RELATIME
    return out


def _plan(cfg: dict) -> tuple[list[tuple[str, bool]], list[tuple[str, str]]]:
    """(path, writable) binds and (path, target) symlinks, each at the same path inside."""
    binds: list[tuple[str, bool]] = []
    links: list[tuple[str, str]] = []
    for path in cfg["system_dirs"]:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append((path, False))
    for path in _ETC_FILES:
        if os.path.lexists(path):
            binds.append((path, False))
    for path in cfg["ro_paths"]:
        if os.path.exists(path) and not _inside(path, binds):
            binds.append((path, False))
    links += [tuple(x) for x in cfg["links"]]
    binds.append((cfg["workdir"], True))
    return binds, links


def _inside(path: str, binds: list[tuple[str, bool]]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b, _ in binds)


def _make_target(new: str, path: str, is_dir: bool) -> str:
    target = new + path
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if is_dir:
        os.makedirs(target, mode=0o755, exist_ok=True)
    elif not os.path.lexists(target):
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    return target


def _etc(new: str, uid: int | None) -> None:
    os.makedirs(new + "/etc", mode=0o755, exist_ok=True)
    me = uid if uid is not None else os.getuid()
    users = {0: "root", me: "sandbox", 65534: "nobody"}
    with open(new + "/etc/passwd", "w") as f:
        f.writelines(f"{name}:x:{u}:{u}:{name}:/nonexistent:/bin/sh\n" for u, name in users.items())
    with open(new + "/etc/group", "w") as f:
        f.writelines(f"{name}:x:{u}:\n" for u, name in users.items())
    with open(new + "/etc/hosts", "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost\n")


def _dev(libc, new: str, tmpfs_mb: int) -> list[tuple[str, int]]:
    _mount(libc, "tmpfs", _make_target(new, "/dev", True), "tmpfs", MS_NOSUID, "mode=755,size=64k")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{new}/dev/{name}")
    os.symlink("/proc/self/fd/1", f"{new}/dev/stdout")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")
    opts = f"size={tmpfs_mb}m,mode=1777"
    _mount(libc, "tmpfs", _make_target(new, "/dev/shm", True), "tmpfs", MS_NOSUID | MS_NODEV, opts)
    return [(d, os.open(d, os.O_PATH | os.O_CLOEXEC)) for d in _DEVICES if os.path.exists(d)]


def _switch_root(libc, new: str) -> None:
    os.chdir(new)
    os.makedirs(new + "/.oldroot", exist_ok=True)
    nr = _PIVOT_ROOT.get(platform.machine())
    if nr is not None and libc.syscall(nr, b".", b".oldroot") == 0:
        os.chdir("/")
        if libc.umount2(b"/.oldroot", MNT_DETACH) != 0:
            raise RootfsError(ctypes.get_errno(), "cannot detach the host's root after pivot_root")
        os.rmdir("/.oldroot")
    else:  # no pivot_root here: move the new root over / and chroot into it
        os.rmdir(new + "/.oldroot")
        _mount(libc, new, "/", None, MS_MOVE, None)
        os.chroot(".")
        os.chdir("/")


def build(libc, cfg: dict) -> None:
    """Assemble the root described in the module docstring and switch into it (raises on any failure)."""
    os.umask(0o022)
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, None)
    binds, links = _plan(cfg)
    binds.sort(key=lambda b: b[0].count("/"))
    sources = [(p, rw, os.open(p, os.O_PATH | os.O_CLOEXEC), _locked_flags(p)) for p, rw in binds]
    new = os.path.realpath("/tmp")  # any directory will do: the host's own stays untouched outside
    _mount(libc, "tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=4m")
    _etc(new, cfg["uid"])
    opts = f"size={cfg['tmpfs_mb']}m,mode=1777"
    for path in ("/tmp", "/var/tmp"):
        _mount(libc, "tmpfs", _make_target(new, path, True), "tmpfs", MS_NOSUID | MS_NODEV, opts)
    devices = _dev(libc, new, cfg["tmpfs_mb"])
    for path, rw, fd, locked in sources + [(d, True, fd, 0) for d, fd in devices]:
        target = _make_target(new, path, os.path.isdir(f"/proc/self/fd/{fd}"))
        _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None)
        if not rw:
            _mount(libc, None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked, None)
        os.close(fd)
    for path, dest in links:
        if not os.path.lexists(new + path):
            os.makedirs(os.path.dirname(new + path), mode=0o755, exist_ok=True)
            os.symlink(dest, new + path)
    for path in cfg["masks"]:
        if _inside(path, binds) and os.path.isdir(new + path) and not os.path.islink(new + path):
            _mount(libc, "tmpfs", new + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=755")
    os.makedirs(new + "/proc", mode=0o555, exist_ok=True)
    _mount(libc, "proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _switch_root(libc, new)
    _mount(libc, None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
