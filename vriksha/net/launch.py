"""vriksha servers as child processes on this machine: a free loopback port, the `vriksha` command line, a start
with the output in a log file (or this process's own), ready once its health URL answers 200, and a stop that
sends SIGTERM and kills what is left after a grace period. `vriksha fleet`, the benchmarks and the tests start
their servers through it."""

from __future__ import annotations

import logging
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import httpx

from vriksha.errors import VrikshaError

logger = logging.getLogger(__name__)

__all__ = ["Child", "StartupError", "StopSignals", "free_port", "stop_all", "vriksha_command"]


class StartupError(VrikshaError):
    """A child server exited during startup, or was not healthy in time."""


# ports below the kernel's ephemeral range: the kernel's own pick (binding port 0) comes from that range, where
# any process's next outgoing connection may take the same number before the server binds it
_PORTS_FROM = 10000
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, below the ephemeral range where outgoing connections take theirs,
    never the same twice in this process (bind it soon: another process may still take it)."""
    end = _ephemeral_start()
    rng = random.SystemRandom()
    for _ in range(200 if end > _PORTS_FROM + 1000 else 0):
        port = rng.randrange(_PORTS_FROM, end)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range: the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]


def vriksha_command(*args: str, log_level: str | None = None) -> list[str]:
    """`python -m vriksha.cli [--log-level LEVEL] ARGS...`, with this process's interpreter."""
    cmd = [sys.executable, "-m", "vriksha.cli"]
    if log_level is not None:
        cmd += ["--log-level", log_level]
    return [*cmd, *args]


class StopSignals:
    """Set once SIGTERM or SIGINT arrives (a fleet's loop checks it and stops its members)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, sig: int, _frame: object) -> None:
        self.stopping = True


class Child:
    """A command run as a child process, ready once GET `health_url` answers 200. With `log_path` its stdout and
    stderr are appended to that file; without, they are this process's own."""

    def __init__(
        self,
        cmd: list[str],
        name: str,
        health_url: str,
        *,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.cmd, self.name, self.health_url = cmd, name, health_url
        self.log_path, self.env, self.cwd, self.preexec_fn = log_path, env, cwd, preexec_fn
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Child:
        self._log = open(self.log_path, "ab") if self.log_path is not None else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self._log,
            stderr=None if self._log is None else subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            preexec_fn=self.preexec_fn,
        )
        return self

    def log_tail(self, n: int = 4000) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _see_log(self) -> str:
        return "; see its log above" if self.log_path is None else f":\n{self.log_tail()}"

    def wait_healthy(self, timeout_s: float, hint: str | None = None) -> None:
        """Poll the health URL; raise `StartupError` if the child exits first or `timeout_s` passes (the
        message ends with `hint` where given, else with where to read the child's log)."""
        assert self.proc is not None, "start() the child first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartupError(
                    f"{self.name} exited with status {self.proc.returncode} during startup{self._see_log()}"
                )
            try:
                if httpx.get(self.health_url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise StartupError(
            f"{self.name} was not healthy after {timeout_s:.0f} s{self._see_log() if hint is None else hint}"
        )

    def kill(self) -> None:
        """SIGKILL, and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL if it is still running after `timeout_s`; the log file is closed."""
        stop_all([self], timeout_s)

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()


def stop_all(children: Sequence[Child], timeout_s: float = 30.0) -> None:
    """SIGTERM in reverse start order (a router before its replicas), then SIGKILL what is left after
    `timeout_s`; their log files are closed."""
    for c in reversed(children):
        if c.proc is not None and c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for c in reversed(children):
        if c.proc is not None:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0f s; killing it", c.name, timeout_s)
                c.proc.kill()
                try:
                    c.proc.wait(10)
                except subprocess.TimeoutExpired:  # a starved machine: the kill lands later
                    logger.error("%s (pid %d) had not exited 10 s after SIGKILL", c.name, c.proc.pid)
        c.close_log()
