"""What a sandboxed run returns, how its output is read, and which limit it hit."""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict, dataclass, field

__all__ = ["SandboxResult", "TRUNCATION_MARKER", "PROTECTIONS", "missing_protections"]

TRUNCATION_MARKER = "\n...[truncated {n} bytes]\n"

# isolation key -> what is exposed without it
PROTECTIONS = {
    "network": "network: the code can reach local and remote servers",
    "pid": "pid namespace: the code sees every host process and its command line (/proc/*/cmdline)",
    "filesystem": "private root: the code can read the host's files (project source, datasets, site-packages)",
    "user": "separate user: the code runs as the caller's user (process limit shared, can signal its processes)",
    "seccomp": "system-call filter: the code can create nested user namespaces and use io_uring "
    "(kernel attack surface a container escape starts from)",
}


def missing_protections(isolation: dict[str, bool], allow_network: bool = False) -> list[str]:
    return [
        text
        for key, text in PROTECTIONS.items()
        if not isolation.get(key) and not (key == "network" and allow_network)
    ]


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
    isolation: dict[str, bool] = field(default_factory=dict)  # network, pid, filesystem, user, seccomp, ...
    missing: list[str] = field(default_factory=list)  # the protections this run did not get, in words
    files: dict[str, bytes] = field(default_factory=dict)  # the `collect`ed output files

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["files"] = {k: v.decode("utf-8", "replace") for k, v in self.files.items()}
        return d


class Drain(threading.Thread):
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


def classify(code: int | None, stderr: str, timed_out: bool, cpu_s: float, duration_s: float) -> str | None:
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
