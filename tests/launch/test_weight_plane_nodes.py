"""The weight plane `auto` picks: shared memory for a server on this node, gloo for a server on another node
(its own IPC namespace and /dev/shm: same host name and loopback address, so the URL alone cannot tell)."""

from __future__ import annotations

import pytest

from tests.launch.nodes import nodes_unavailable, own_node
from tests.server.conftest import WEIGHTS_KEY, ServerProcess, build_tiny_model
from vriksha.weights import WeightSyncClient, digest

pytestmark = pytest.mark.slow

SERVER_ARGS = ["--kv-cache-memory-gb", "0.05", "--max-model-len", "512"]
_why = nodes_unavailable()


def _model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for p in model.parameters():
        p.data.mul_(1.01)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.skipif(_why is not None, reason=_why or "")
@pytest.mark.parametrize(("where", "plane"), [("this node", "shm"), ("another node", "gloo")])
def test_auto_picks_shared_memory_only_on_the_same_node(where, plane, model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "VRIKSHA_WEIGHTS_KEY", WEIGHTS_KEY
    )  # the server's weights key, which the client presents
    preexec = own_node() if where == "another node" else None
    server = ServerProcess(
        ["--model", str(model_dir), *SERVER_ARGS], tmp_path / "server.log", preexec_fn=preexec
    )
    client = WeightSyncClient(server.base_url, "trainer", backend="auto", bucket_bytes=1 << 16)
    try:
        assert client.shares_memory() is (plane == "shm")
        model = _model(model_dir)
        result = client.push(model, version=1)
        assert result.backend == plane
        assert client.digests() == {n: digest(p) for n, p in model.named_parameters()}
    finally:
        client.close()
        server.stop()
