"""Server test harness: a tiny random Llama saved with the embedded tokenizer, and `vriksha serve` as a real
subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from vriksha.net.launch import Child, StartupError, free_port, vriksha_command

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 240.0
TINY_MAX_MODEL_LEN = 2048


# the role keys test servers are started with (tests/router: every replica and router shares the internal key;
# tests/weights: the weight servers and their trainers share the weights key)
INTERNAL_KEY = "test-internal-key-0123456789"
WEIGHTS_KEY = "test-weights-key-0123456789"
INTERNAL = {"x-vriksha-internal-key": INTERNAL_KEY}
WEIGHTS = {"x-vriksha-weights-key": WEIGHTS_KEY}


def child_env() -> dict[str, str]:
    """This environment with the worktree first on PYTHONPATH and one OpenMP thread unless set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


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


class ServerProcess(Child):
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
        cmd = vriksha_command("serve", "--port", str(self.port), *args, log_level="INFO")
        if api_key:
            cmd += ["--api-key", api_key]
        super().__init__(
            cmd,
            "server",
            f"{self.base_url}/health",
            log_path=log_path,
            env=child_env(),
            cwd=str(REPO),
            preexec_fn=preexec_fn,
        )
        self.start()
        try:
            self.wait_healthy(STARTUP_TIMEOUT_S)
        except StartupError:
            self.stop()
            raise

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
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.close_log()


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
