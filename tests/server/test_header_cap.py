"""The documented header cap (`--max-header-bytes`, 16 KiB) on real processes on loopback, `vriksha serve` and
`vriksha router` in front of it: a head past the cap gets 431 and the connection closes, whether it arrives
in one read, in pieces, or pipelined behind a small request; a head under the cap is served."""

from __future__ import annotations

import socket
import time

import pytest

from tests.server.conftest import REPO, child_env
from vriksha.net.launch import Child, free_port, vriksha_command

CAP = 16 * 1024


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    return server_factory(["--model", str(tiny_model_dir), "--kv-cache-memory-gb", "0.05"])


@pytest.fixture(scope="module")
def router(server, tiny_model_dir, tmp_path_factory):
    port = free_port()
    cmd = vriksha_command("router", "--model", str(tiny_model_dir), "--port", str(port), log_level="INFO")
    cmd += ["--replica", server.base_url, "--health-interval", "0.3"]
    log = tmp_path_factory.mktemp("router-log") / "router.log"
    child = Child(
        cmd, "router", f"http://127.0.0.1:{port}/health", log_path=log, env=child_env(), cwd=str(REPO)
    )
    child.start()
    child.port = port  # type: ignore[attr-defined]
    try:
        child.wait_healthy(240)
        yield child
    finally:
        child.stop()


def _head(header_bytes: int, close: bool = True) -> bytes:
    connection = b"close" if close else b"keep-alive"
    pad = b"a" * header_bytes
    return (
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: " + connection + b"\r\nX-Pad: " + pad + b"\r\n\r\n"
    )


def _exchange(port: int, pieces: list[bytes], pause_s: float = 0.0) -> bytes:
    """Send `pieces` (pausing between them), then read until the server closes; what it answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for piece in pieces:
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):  # closed after its answer: read that
                break
            time.sleep(pause_s)
        chunks = []
        try:
            while data := s.recv(65536):
                chunks.append(data)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


@pytest.mark.slow
@pytest.mark.parametrize("front", ["server", "router"])
def test_a_head_past_the_cap_gets_431_however_it_arrives(front, request):
    port = request.getfixturevalue(front).port
    small = _head(8 * 1024)
    answer = _exchange(port, [small])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]

    for size in (CAP + 1024, 100 * 1024):
        answer = _exchange(port, [_head(size)])
        assert answer.startswith(b"HTTP/1.1 431"), (size, answer[:200])
        assert b"request_header_fields_too_large" in answer and b"--max-header-bytes" in answer

    big = _head(100 * 1024)
    pieces = [big[i : i + 2048] for i in range(0, len(big), 2048)]
    answer = _exchange(port, pieces, pause_s=0.01)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]

    pipelined = _head(8 * 1024, close=False) + _head(40 * 1024)  # on one read, behind a small request
    answer = _exchange(port, [pipelined])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 431" in answer, answer[-400:]
