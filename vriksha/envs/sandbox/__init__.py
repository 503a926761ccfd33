"""Run untrusted code (model output, repository tests) in a contained child process.

`run_sandboxed(cmd, ...)` starts a small launcher (`_launcher.py`, run as a script, stdlib only) that,
before it `exec`s the command:
- unshares mount, PID, IPC, UTS and network namespaces (as non-root inside a user namespace that maps
  only the caller's uid), so the code sees a fresh /proc with its own processes only and no network;
- builds a minimal root (`_rootfs.py`): the work directory, the real base interpreter, its standard
  library and the system libraries read-only, site-packages masked, fresh /tmp, /var/tmp, /dev/shm;
  nothing else of the host (not the project's source, not other datasets);
- runs the command under a PID 1 that dies with the launcher; when the command exits, the kernel kills
  everything it left behind;
- as root drops to a fresh unprivileged uid (so RLIMIT_NPROC applies and its processes can be killed);
- installs a seccomp filter (`_seccomp.py`): no nested user namespaces (unshare/clone with
  CLONE_NEWUSER), no io_uring; both fail with EPERM;
- sets rlimits: CPU seconds, address space, processes, file size, no core files; a scrubbed environment.

On timeout everything is killed. Output is truncated per stream with a marker. The result says which
limit was hit and which protections the run got (`isolation`) or lacked (`missing`). Where the machine
allows no namespaces, `run_sandboxed` refuses unless VRIKSHA_ALLOW_UNSANDBOXED=1 (`check.py`).
"""

from vriksha.envs.sandbox.check import SandboxReport, require_sandbox, sandbox_report, unsandboxed_allowed
from vriksha.envs.sandbox.errors import ALLOW_UNSANDBOXED_ENV, SandboxError, SandboxUnavailableError
from vriksha.envs.sandbox.interpreter import sandbox_python
from vriksha.envs.sandbox.result import TRUNCATION_MARKER, SandboxResult
from vriksha.envs.sandbox.run import read_output, run_sandboxed

__all__ = [
    "ALLOW_UNSANDBOXED_ENV",
    "SandboxError",
    "SandboxReport",
    "SandboxResult",
    "SandboxUnavailableError",
    "TRUNCATION_MARKER",
    "read_output",
    "require_sandbox",
    "run_sandboxed",
    "sandbox_python",
    "sandbox_report",
    "unsandboxed_allowed",
]
