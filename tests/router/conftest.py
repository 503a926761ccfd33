"""Router test harness: `vriksha serve` replicas with KV event streams, `vriksha router` and `vllm-router`
as real processes on loopback ports, each stopped however its test ends."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import INTERNAL, INTERNAL_KEY, REPO, build_tiny_model, child_env, free_port
from vriksha.net.launch import Child, StartupError, vriksha_command

STARTUP_TIMEOUT_S = 300.0


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


class Proc(Child):
    """A subprocess with its log in a file, ready once GET `health_url` answers 200."""

    def __init__(self, cmd: list[str], log_path: Path, health_url: str, name: str) -> None:
        env = {**child_env(), "VRIKSHA_INTERNAL_KEY": INTERNAL_KEY}  # replicas' and routers' shared key
        super().__init__(cmd, name, health_url, log_path=log_path, env=env, cwd=str(REPO))

    def start(self, wait: bool = True) -> Proc:
        super().start()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        try:
            self.wait_healthy(timeout_s)
        except StartupError:
            self.stop()
            raise


class Replica(Proc):
    def __init__(self, model_dir: Path, log_dir: Path, index: int, vllm_events: bool = True) -> None:
        self.port, self.events_port, self.vllm_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events = f"tcp://127.0.0.1:{self.events_port}"
        self.vllm_events = f"tcp://127.0.0.1:{self.vllm_port}"
        cmd = vriksha_command("serve", "--model", str(model_dir), log_level="INFO")
        cmd += ["--port", str(self.port), "--kv-events-endpoint", self.events, "--no-native-kernels"]
        if vllm_events:
            cmd += ["--kv-events-vllm-endpoint", self.vllm_events]
        super().__init__(cmd, log_dir / f"replica{index}.log", f"{self.url}/health", f"replica {index}")

    @property
    def spec(self) -> str:
        return f"{self.url},{self.events}"

    def snapshot(self) -> dict:
        return httpx.get(f"{self.url}/kv_events/snapshot", headers=INTERNAL, timeout=10).json()


class Router(Proc):
    def __init__(
        self, model_dir: Path, log_dir: Path, replicas: list[Replica], *extra: str, name: str = "router"
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = vriksha_command("router", "--model", str(model_dir), log_level="INFO")
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
