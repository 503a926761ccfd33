"""`vriksha env serve` behind the HTTP front: its connection cap, header deadline and body cap, on a real
loopback port, and its HTTP session endpoints' strict number and text checks."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from websockets.sync.client import connect

from vriksha.envs.builtin import ArithmeticEnv
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app
from vriksha.net import FrontConfig

pytestmark = pytest.mark.timeout(120)

FRONT = FrontConfig(max_connections=6, header_timeout_s=1.0, max_body_bytes=2000)


@pytest.fixture(scope="module")
def base():
    with ServerThread(create_app(ArithmeticEnv, EnvServerConfig(max_sessions=4, front=FRONT))) as url:
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_connections_beyond_the_cap_get_503_then_idle_ones_are_closed(base):
    idle = [
        socket.create_connection(("127.0.0.1", _port(base)), timeout=5) for _ in range(FRONT.max_connections)
    ]
    try:
        time.sleep(0.2)
        r = httpx.get(f"{base}/health", timeout=5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections", r.text
        assert "--max-connections=6" in r.json()["error"]["message"]
        for s in idle:  # the header deadline closes every one of them, with a 408
            s.settimeout(5)
            assert s.recv(200).startswith(b"HTTP/1.1 408")
    finally:
        for s in idle:
            s.close()
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200


def test_a_websocket_session_outlives_the_header_deadline(base):
    with connect(base.replace("http://", "ws://") + "/v1/ws") as ws:
        ws.recv(timeout=5)  # hello
        time.sleep(FRONT.header_timeout_s + 0.5)
        ws.send('{"id": 1, "op": "reset", "seed": 3}')
        assert '"ok":true' in ws.recv(timeout=5).replace(" ", "")


def test_body_over_the_cap_is_413_and_numbers_and_text_are_checked(base):
    created = httpx.post(f"{base}/v1/sessions", timeout=5).json()
    sid = created["session_id"]
    owner = {"X-Vriksha-Resume-Token": created["resume_token"]}
    try:
        r = httpx.post(
            f"{base}/v1/sessions/{sid}/step", json={"action": {"text": "9" * 5000}}, headers=owner, timeout=5
        )
        assert r.status_code == 413 and "2000 bytes" in r.json()["error"]["message"], r.text
        r = httpx.post(f"{base}/v1/sessions/{sid}/reset", json={"seed": 2**70}, headers=owner, timeout=5)
        assert r.status_code == 400 and "seed" in r.text, r.text
        r = httpx.post(
            f"{base}/v1/sessions/{sid}/reset",
            content=b'{"seed": 1, "options": {"split": "\\ud800"}}',
            headers={"Content-Type": "application/json", **owner},
            timeout=5,
        )
        assert r.status_code == 400, r.text
        r = httpx.post(f"{base}/v1/sessions/{sid}/reset", json={"seed": 2**63 - 1}, headers=owner, timeout=5)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{base}/reset", json={"seed": 2**70}, timeout=5)  # OpenEnv's one-shot reset
        assert r.status_code == 422 and "must be an integer from 0 to 2**64 - 1" in r.text, r.text
    finally:
        httpx.delete(f"{base}/v1/sessions/{sid}", headers=owner, timeout=5)
