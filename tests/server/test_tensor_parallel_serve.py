"""`vriksha serve --tensor-parallel-size 2`: it serves, and a rank killed mid-request takes the server down
cleanly: the request gets an error naming the rank, the server exits non-zero, no rank is left running."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the rank's process through /proc")
def test_serves_on_two_ranks_and_exits_when_one_dies(server_factory, tiny_model_dir):
    server = server_factory(
        ["--model", str(tiny_model_dir), "--tensor-parallel-size", "2", "--kv-cache-memory-gb", "0.02"]
    )
    url = f"{server.base_url}/v1/completions"
    body = {
        "model": tiny_model_dir.name,
        "prompt": "The capital of France is",
        "max_tokens": 8,
        "temperature": 0,
    }
    ok = httpx.post(url, json=body, timeout=120)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 8

    ranks = _children(server.proc.pid)
    assert len(ranks) == 1, ranks
    result: dict = {}

    def long_request() -> None:
        try:
            long = {**body, "max_tokens": 1500, "ignore_eos": True}
            result["response"] = httpx.post(url, json=long, timeout=120)
        except httpx.HTTPError as exc:
            result["error"] = exc

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(2.0)  # the request is decoding
    os.kill(ranks[0], signal.SIGKILL)
    started = time.monotonic()
    thread.join(timeout=60)
    assert not thread.is_alive()
    response = result.get("response")
    assert response is not None, result
    assert response.status_code == 503, response.text
    assert "rank 1" in response.json()["error"]["message"]
    assert server.proc.wait(timeout=60) != 0
    assert time.monotonic() - started < 90
    assert not any(_alive(pid) for pid in ranks)
    assert "was killed by SIGKILL" in server.log_tail(20000)
