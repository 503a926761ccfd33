"""A tiny Llama directory and one `vriksha serve` over it, shared by the weight-transfer tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import WEIGHTS_KEY, ServerProcess, build_tiny_model

SERVER_ARGS = ["--kv-cache-memory-gb", "0.05", "--max-model-len", "512"]


@pytest.fixture(scope="session", autouse=True)
def weights_key() -> Iterator[str]:
    """The weights key of every server here, in this process's environment (where `WeightSyncClient` and the
    servers started after it read it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VRIKSHA_WEIGHTS_KEY", WEIGHTS_KEY)
        yield WEIGHTS_KEY


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def weight_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("weight-server") / "server.log"
    s = ServerProcess(["--model", str(tiny_model_dir), *SERVER_ARGS], log)
    try:
        yield s
    finally:
        s.stop()
