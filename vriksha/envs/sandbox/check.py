"""The sandbox's self-test: can it run here, and which protections does it give?

`sandbox_report()` runs a small probe through the sandbox once per process and per setting: the
interpreter must start and answer; what the probe sees (its PID, the host's processes, the project's
own source, the network, a nested user namespace) is compared with what the launcher claims. `require_sandbox()` raises
`SandboxUnavailableError` when the sandbox cannot run, or when protections are missing and the user
has not opted in with VRIKSHA_ALLOW_UNSANDBOXED=1; environments that run untrusted code call it at
start-up, so a broken sandbox fails loudly instead of scoring every episode 0.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from vriksha.envs.sandbox.errors import ALLOW_UNSANDBOXED_ENV, SandboxUnavailableError
from vriksha.envs.sandbox.interpreter import root_spec
from vriksha.envs.sandbox.result import missing_protections
from vriksha.envs.sandbox.run import SIMULATE_NO_NAMESPACES_ENV, run_unchecked

logger = logging.getLogger(__name__)

__all__ = ["SandboxReport", "sandbox_report", "require_sandbox", "unsandboxed_allowed"]

_PROJECT_FILE = str(Path(__file__).resolve())
_PROBE = r"""
import ctypes, json, os, socket, sys
userns = "created" if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0 else "refused"
pids = [p for p in os.listdir("/proc") if p.isdigit()]
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1).close()
    net = "reached"
except OSError as exc:
    net = type(exc).__name__
print(json.dumps({"ok": 2 + 2, "pid": os.getpid(), "procs": len(pids),
                  "sees_source": os.path.exists(sys.argv[1]), "net": net, "userns": userns}))
"""


@dataclass(slots=True)
class SandboxReport:
    runs: bool
    isolation: dict[str, bool] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    python: str = ""
    detail: str = ""

    def describe(self) -> str:
        if not self.runs:
            return f"the sandbox cannot run: {self.detail}"
        if not self.missing:
            return "network, PID namespace, private root, separate user and system-call filter: all isolated"
        return "missing protections: " + "; ".join(self.missing)


def unsandboxed_allowed() -> bool:
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes")


_lock = threading.Lock()
_warned: set[str] = set()


@functools.cache
def _probe(allow_network: bool, simulate: str | None) -> SandboxReport:
    spec = root_spec()
    try:
        res = run_unchecked(
            [spec.python, "-I", "-S", "-c", _PROBE, _PROJECT_FILE],
            timeout_s=30,
            memory_mb=512,
            max_procs=8,
            allow_network=allow_network,
        )
    except SandboxUnavailableError as exc:
        return SandboxReport(False, python=spec.python, detail=str(exc))
    out = res.stdout.strip().splitlines()
    try:
        seen = json.loads(out[-1]) if out else {}
    except json.JSONDecodeError:
        seen = {}
    if res.exit_code != 0 or seen.get("ok") != 4:
        detail = (
            f"the probe ({spec.python}) exited with {res.exit_code}"
            f"{' (timed out)' if res.timed_out else ''}; stderr: {res.stderr.strip()[-600:] or '(empty)'}"
        )
        return SandboxReport(False, res.isolation, python=spec.python, detail=detail)
    iso = dict(res.isolation)
    # trust what the probe saw over what the launcher claims
    iso["pid"] = iso.get("pid", False) and seen.get("pid") in (1, 2) and seen.get("procs", 99) <= 3
    iso["filesystem"] = iso.get("filesystem", False) and not seen.get("sees_source")
    iso["seccomp"] = iso.get("seccomp", False) and seen.get("userns") == "refused"
    if not allow_network:
        iso["network"] = iso.get("network", False) and seen.get("net") != "reached"
    return SandboxReport(True, iso, missing_protections(iso, allow_network), python=spec.python)


def sandbox_report(allow_network: bool = False) -> SandboxReport:
    """The self-test's result (run once per process and setting)."""
    with _lock:
        return _probe(allow_network, os.environ.get(SIMULATE_NO_NAMESPACES_ENV))


def require_sandbox(*, allow_network: bool = False, what: str = "untrusted code") -> SandboxReport:
    """Raise `SandboxUnavailableError` unless the sandbox runs here and isolates (or the user opted in)."""
    report = sandbox_report(allow_network)
    if not report.runs:
        raise SandboxUnavailableError(
            f"{report.describe()}. Nothing can be scored without it; check that {report.python} runs and "
            "that the machine allows namespaces (see docs/environments.md, 'Threat model')"
        )
    if report.missing:
        if not unsandboxed_allowed():
            raise SandboxUnavailableError(
                f"refusing to run {what}: the sandbox here lacks {len(report.missing)} protection(s): "
                + "; ".join(report.missing)
                + f". Run as root or where user namespaces are allowed, or set {ALLOW_UNSANDBOXED_ENV}=1 "
                "to run it anyway with the protections that remain"
            )
        if what not in _warned:
            _warned.add(what)
            logger.warning(
                "sandbox: running %s with protections missing: %s", what, "; ".join(report.missing)
            )
    return report
