"""Server test harness: a tiny random Llama saved with the embedded tokenizer, and `vriksha serve` as a real
subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 240.0
TINY_MAX_MODEL_LEN = 2048


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tiny_model(out: Path) -> Path:
    from tests.tiny_llama import embedded_tokenizer, save_model_dir, tiny_llama

    tok = embedded_tokenizer()
    model = tiny_llama(
        tok,
        max_position_embeddings=TINY_MAX_MODEL_LEN,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
    )
    return save_model_dir(model, tok, out)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


class ServerProcess:
    """`python -m vriksha.cli serve ...` on 127.0.0.1:<free port>, its log in a file."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        api_key: str | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("OMP_NUM_THREADS", "1")
        cmd = [
            sys.executable,
            "-m",
            "vriksha.cli",
            "--log-level",
            "INFO",
            "serve",
            "--port",
            str(self.port),
            *args,
        ]
        if api_key:
            cmd += ["--api-key", api_key]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), preexec_fn=preexec_fn
        )
        self._wait_ready()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} during startup:\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """Unlabelled `vriksha_*` samples from /metrics."""
        text = httpx.get(f"{self.base_url}/metrics", headers=self.headers, timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vriksha_") and "{" not in line:
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    started: list[ServerProcess] = []

    def make(
        args: list[str], api_key: str | None = None, preexec_fn: Callable[[], None] | None = None
    ) -> ServerProcess:
        log = tmp_path_factory.mktemp("server-log") / "server.log"
        s = ServerProcess(args, log, api_key, preexec_fn)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
