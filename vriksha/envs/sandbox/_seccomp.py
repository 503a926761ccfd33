"""The sandbox's system-call filter (stdlib only; installed by the launcher, inherited by the command).

A classic-BPF seccomp program, built here with `struct` and installed with prctl(PR_SET_SECCOMP):
- `unshare` and `clone` with CLONE_NEWUSER fail with EPERM: no nested user namespace, so no
  capabilities inside one (the way to mount, to reach kernel code behind CAP_SYS_ADMIN);
- `clone3` fails with ENOSYS (its flags sit in memory a filter cannot read; the C library then
  falls back to `clone`, which is checked);
- `io_uring_setup`, `io_uring_enter` and `io_uring_register` fail with EPERM;
- x32 system calls fail with EPERM, and a process of another architecture (i386 through int 0x80)
  is killed: their numbers would slip past the table.
Everything else is allowed. PR_SET_NO_NEW_PRIVS comes first (the kernel requires it of an
unprivileged caller; it also makes set-uid programs run without their privileges).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS = 0x7FFF0000, 0x80000000
_ERRNO = 0x00050000
# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian: low word first)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

# architecture -> (AUDIT_ARCH_*, unshare, clone, clone3); io_uring is 425..427 on every architecture
_TABLES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}
IO_URING = (425, 426, 427)


def program(machine: str) -> bytes | None:
    """The filter for `machine` as packed sock_filter records, or None where no table exists."""
    table = _TABLES.get(machine)
    if table is None:
        return None
    arch, unshare, clone, clone3 = table
    deny, nosys, kill, allow = "deny", "nosys", "kill", "allow"
    code: list[tuple[int, object, object, int]] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 0, kill, arch),
        (_LD_ABS, 0, 0, _NR),
    ]
    if machine == "x86_64":
        code.append((_JGE, deny, 0, X32_SYSCALL_BIT))
    code += [(_JEQ, deny, 0, nr) for nr in IO_URING]
    code += [
        (_JEQ, nosys, 0, clone3),
        (_JEQ, "flags", 0, unshare),
        (_JEQ, "flags", 0, clone),
        (_RET, 0, 0, _ALLOW),
    ]
    labels = {"flags": len(code)}
    code += [(_LD_ABS, 0, 0, _ARG0_LOW), (_JSET, deny, allow, CLONE_NEWUSER)]
    labels.update({allow: len(code), deny: len(code) + 1, nosys: len(code) + 2, kill: len(code) + 3})
    code += [
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EPERM),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_RET, 0, 0, _KILL_PROCESS),
    ]

    def offset(target: object, at: int) -> int:  # jumps are relative to the next instruction
        return 0 if target == 0 else labels[str(target)] - at - 1

    return b"".join(
        struct.pack("=HBBI", op, offset(jt, i), offset(jf, i), k) for i, (op, jt, jf, k) in enumerate(code)
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(libc) -> str | None:
    """Install the filter on this thread (inherited across fork and exec); None, or why it could not be."""
    filt = program(platform.machine())
    if filt is None:
        return f"no system-call table for {platform.machine()}"
    buf = ctypes.create_string_buffer(filt, len(filt))
    prog = _SockFprog(len(filt) // 8, ctypes.cast(buf, ctypes.c_void_p))
    ulong = ctypes.c_ulong
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(ctypes.get_errno(), '?')}"
    if libc.prctl(PR_SET_SECCOMP, ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), ulong(0), ulong(0)) != 0:
        return f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(ctypes.get_errno(), '?')}"
    return None
