"""Router test harness: `vriksha serve` replicas with KV event streams, `vriksha router` and `vllm-router`
as real processes on loopback ports, each stopped however its test ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import REPO, build_tiny_model, free_port

STARTUP_TIMEOUT_S = 300.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def wait_until(check, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll `check()` until it returns a truthy value; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


class Proc:
    """A subprocess with its log in a file, ready once GET `health_url` answers 200."""

    def __init__(self, cmd: list[str], log_path: Path, health_url: str, name: str) -> None:
        self.cmd, self.log_path, self.health_url, self.name = cmd, log_path, health_url, name
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> Proc:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=_env(), cwd=str(REPO)
        )
        if wait:
            self.wait_ready()
        return self

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.health_url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout_s} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


class Replica(Proc):
    def __init__(self, model_dir: Path, log_dir: Path, index: int, vllm_events: bool = True) -> None:
        self.port, self.events_port, self.vllm_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events = f"tcp://127.0.0.1:{self.events_port}"
        self.vllm_events = f"tcp://127.0.0.1:{self.vllm_port}"
        cmd = [sys.executable, "-m", "vriksha.cli", "--log-level", "INFO", "serve", "--model", str(model_dir)]
        cmd += ["--port", str(self.port), "--kv-events-endpoint", self.events, "--no-native-kernels"]
        if vllm_events:
            cmd += ["--kv-events-vllm-endpoint", self.vllm_events]
        super().__init__(cmd, log_dir / f"replica{index}.log", f"{self.url}/health", f"replica {index}")

    @property
    def spec(self) -> str:
        return f"{self.url},{self.events}"

    def snapshot(self) -> dict:
        return httpx.get(f"{self.url}/kv_events/snapshot", timeout=10).json()


class Router(Proc):
    def __init__(
        self, model_dir: Path, log_dir: Path, replicas: list[Replica], *extra: str, name: str = "router"
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "vriksha.cli",
            "--log-level",
            "INFO",
            "router",
            "--model",
            str(model_dir),
        ]
        cmd += ["--port", str(self.port), "--load-interval", "0.1", "--health-interval", "0.3", *extra]
        for r in replicas:
            cmd += ["--replica", r.spec]
        super().__init__(cmd, log_dir / f"{name}.log", f"{self.url}/health", name)

    def replicas(self) -> list[dict]:
        return httpx.get(f"{self.url}/router/replicas", timeout=5).json()["replicas"]

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def vllm_router_binary() -> str | None:
    found = shutil.which("vllm-router")
    if found:
        return found
    candidate = Path(sys.executable).with_name("vllm-router")
    return str(candidate) if candidate.exists() else None


@pytest.fixture(scope="session")
def router_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("router-tiny"))


@pytest.fixture(scope="session")
def replicas(router_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two replicas for tests that leave them running (the failure tests start their own)."""
    log_dir = tmp_path_factory.mktemp("router-logs")
    reps = [Replica(router_model_dir, log_dir, i) for i in range(2)]
    try:
        for r in reps:
            r.start(wait=False)
        for r in reps:
            r.wait_ready()
        yield reps
    finally:
        for r in reps:
            r.stop()
