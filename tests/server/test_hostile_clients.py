"""Hostile clients against a real `vriksha serve` on loopback, its descriptor limit lowered to 256: idle and
slow-loris connections beyond what the limit allows are refused with a JSON 503, the ones admitted are closed
at the header deadline, a slow body at the body deadline, normal requests are served again within seconds,
and the server's log stays small (no flood of "Too many open files")."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time

import httpx
import pytest

MODEL = "tiny"
FD_LIMIT = 256
HEADER_TIMEOUT_S = 2.0
ATTACKERS = 300  # more than FD_LIMIT: without a cap the server runs out of descriptors
SERVED_WITHIN_S = 30.0


def _low_fd_limit() -> None:  # in the server's process, before exec: soft and hard, so it cannot raise them
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    return server_factory(
        [
            "--model",
            str(tiny_model_dir),
            "--kv-cache-memory-gb",
            "0.05",
            "--served-model-name",
            MODEL,
            "--header-timeout",
            str(HEADER_TIMEOUT_S),
            "--body-timeout",
            "2",
            "--keep-alive-timeout",
            "1",
        ],
        preexec_fn=_low_fd_limit,
    )


def _read_all(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server sends until it closes (or resets); `<timeout>` appended if it did not close in time."""
    sock.settimeout(timeout_s)
    chunks: list[bytes] = []
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    except TimeoutError:
        chunks.append(b"<timeout>")
    except ConnectionResetError:  # after the answer: the slow-loris thread wrote to the closed socket
        pass
    return b"".join(chunks)


def _completion(server) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": MODEL, "prompt": "Hello", "max_tokens": 2},
        timeout=5,
    )


@pytest.mark.slow
def test_idle_and_slow_loris_clients_do_not_deny_service(server):
    log_size_before = server.log_path.stat().st_size
    socks: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:  # slow-loris: one header byte every 0.5 s on every other connection
        for _ in range(40):
            if stop.wait(0.5):
                return
            for s in socks[::2]:
                try:  # stop once the server answered: writing to a closed socket resets it, losing the answer
                    s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    continue
                except BlockingIOError:
                    pass  # nothing from the server yet: one more byte
                except OSError:
                    continue
                try:
                    s.send(b"X")
                except OSError:
                    pass

    try:
        for i in range(ATTACKERS):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            if i % 2 == 0:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.5)
        # normal clients: at once a clear refusal or an answer, and an answer within seconds
        refusals: list[dict] = []
        deadline = time.monotonic() + SERVED_WITHIN_S
        served = None
        while time.monotonic() < deadline:
            try:
                r = _completion(server)
            except httpx.HTTPError:
                time.sleep(0.25)
                continue
            if r.status_code == 200:
                served = r
                break
            assert r.status_code == 503, r.text
            refusals.append(r.json()["error"])
            time.sleep(0.25)
        assert served is not None, f"no normal request served in {SERVED_WITHIN_S} s:\n{server.log_tail()}"
        assert served.json()["choices"][0]["text"] is not None
        assert all(e["code"] == "too_many_connections" for e in refusals), refusals[:3]
        # every attacking connection got an answer and was closed: 503 beyond the cap, 408 at the deadline
        answers = [_read_all(s, 10.0) for s in socks]
        statuses = [a.split(b" ", 2)[1] if a.startswith(b"HTTP/1.1 ") else a[:20] for a in answers]
        assert all(st in (b"503", b"408") for st in statuses), sorted(set(statuses))
        assert statuses.count(b"503") >= ATTACKERS - FD_LIMIT, "the descriptor limit allowed them all?"
        body = json.loads(answers[statuses.index(b"408")].partition(b"\r\n\r\n")[2])
        assert body["error"]["code"] == "request_timeout" and "--header-timeout" in body["error"]["message"]
    finally:
        stop.set()
        for s in socks:
            s.close()
    assert _completion(server).status_code == 200
    grown = server.log_path.stat().st_size - log_size_before
    log = server.log_tail(200_000)
    assert grown < 50_000, f"the log grew {grown} bytes:\n{log[-3000:]}"
    assert log.count("Too many open files") <= 10, log[-3000:]
    assert server.proc.poll() is None


@pytest.mark.slow
def test_slow_body_gets_408_and_an_idle_keep_alive_connection_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        t0 = time.monotonic()
        answer = _read_all(s, 15.0)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"--body-timeout" in answer and time.monotonic() - t0 < 10
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = time.monotonic()
        answer = _read_all(s, 15.0)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"}"), answer[-200:]  # then closed
        assert time.monotonic() - t0 < 5  # by the 1 s keep-alive timeout
