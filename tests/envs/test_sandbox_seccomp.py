"""The sandbox's system-call filter: sandboxed code cannot make a nested user namespace (unshare, clone)
nor set up io_uring, and ordinary code (threads, subprocesses, a shell) still runs. Real processes."""

import json
import shutil
import struct

import pytest

from vriksha.envs.sandbox import run_sandboxed, sandbox_python
from vriksha.envs.sandbox._seccomp import program

ATTACKS = r"""
import ctypes, json, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
out = {}
r = libc.unshare(CLONE_NEWUSER)
out["unshare"] = [r, ctypes.get_errno()]
pid = libc.syscall(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)  # clone(2) on x86_64: a fork in a new user ns
if pid == 0:
    os._exit(0)
out["clone"] = [pid, ctypes.get_errno()]
if pid > 0:
    os.waitpid(pid, 0)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 8, params)  # io_uring_setup(entries, params)
out["io_uring_setup"] = [fd, ctypes.get_errno()]
out["io_uring_enter"] = [libc.syscall(426, 0, 0, 0, 0, 0, 0), ctypes.get_errno()]
if os.environ.get("UNSHARE"):  # the util-linux tool, as an attacker would use it
    p = subprocess.run([os.environ["UNSHARE"], "-U", "true"], capture_output=True, text=True)
    out["unshare_cmd"] = [p.returncode, p.stderr.strip()]
t = threading.Thread(target=lambda: out.setdefault("thread", True))
t.start()
t.join()
out["shell"] = subprocess.run(["/bin/sh", "-c", "echo hi"], capture_output=True, text=True).stdout.strip()
child = os.fork()
if child == 0:
    os._exit(3)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
print(json.dumps(out))
"""

EPERM = 1


@pytest.mark.skipif(program(__import__("platform").machine()) is None, reason="no system-call table here")
def test_nested_user_namespaces_and_io_uring_are_refused_ordinary_code_runs():
    env = {"UNSHARE": shutil.which("unshare") or ""}
    r = run_sandboxed([sandbox_python(), "attack.py"], files={"attack.py": ATTACKS}, timeout_s=30, env=env)
    assert r.exit_code == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["unshare"] == [-1, EPERM], seen
    if __import__("platform").machine() == "x86_64":
        assert seen["clone"] == [-1, EPERM], seen
    assert seen["io_uring_setup"] == [-1, EPERM] and seen["io_uring_enter"] == [-1, EPERM], seen
    if env["UNSHARE"]:
        assert seen["unshare_cmd"][0] != 0 and "not permitted" in seen["unshare_cmd"][1], seen
    assert seen["thread"] and seen["shell"] == "hi" and seen["fork"] == 3, seen
    assert r.isolation["seccomp"] and r.missing == []


def test_the_filter_checks_the_architecture_first():
    """A 32-bit process (another audit arch) would use other numbers: the filter kills it before any table."""
    filt = program("x86_64")
    assert filt is not None and len(filt) % 8 == 0
    first = [struct.unpack("=HBBI", filt[i : i + 8]) for i in range(0, 16, 8)]
    assert first[0] == (0x20, 0, 0, 4)  # load seccomp_data.arch
    assert first[1][0] == 0x15 and first[1][3] == 0xC000003E  # jump unless AUDIT_ARCH_X86_64
    last = struct.unpack("=HBBI", filt[-8:])
    assert last == (0x06, 0, 0, 0x80000000)  # the mismatch lands on SECCOMP_RET_KILL_PROCESS
    assert program("sparc") is None
