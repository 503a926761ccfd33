"""A server that dies mid-update: the trainer's push fails with a clear error, and the server restarted on
the filesystem plane's directory takes the last complete version, never the torn one."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import WEIGHTS, ServerProcess
from tests.weights.conftest import SERVER_ARGS
from tests.weights.test_weight_server import _trainer_model
from vriksha.weights import WeightSyncClient, WeightTransferError, digest
from vriksha.weights.fs import MARKER, version_dir


def test_killed_server_restarts_on_last_complete_version(tiny_model_dir, tmp_path):
    root = tmp_path / "weights"
    args = ["--model", str(tiny_model_dir), *SERVER_ARGS]
    server = ServerProcess(args, tmp_path / "a.log")
    good = _trainer_model(tiny_model_dir, seed=21)
    try:
        client = WeightSyncClient(server.base_url, "run-1", backend="fs", fs_root=root)
        client.push(good, version=1)
        torn = _trainer_model(tiny_model_dir, seed=22)
        client.push(torn, version=2)
        (version_dir(root, 2) / MARKER).unlink()  # as if the trainer died before the marker
        server.proc.kill()  # kill -9 mid-run
        server.proc.wait(30)
        with pytest.raises(WeightTransferError, match="unreachable"):
            client.push(good, version=3)
        client.http.close()
    finally:
        server.stop()
    restarted = ServerProcess([*args, "--load-weights-dir", str(root)], tmp_path / "b.log")
    try:
        assert httpx.get(f"{restarted.base_url}/weight_version", timeout=30).json()["version"] == 1
        served = httpx.get(f"{restarted.base_url}/weight_digests", headers=WEIGHTS, timeout=60).json()
        assert served == {n: digest(p) for n, p in good.named_parameters()}
    finally:
        restarted.stop()
