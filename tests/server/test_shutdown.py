"""SIGTERM: the server stops accepting, lets a short in-flight stream finish, aborts one that outlives the
shutdown timeout, and exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]

MODEL = "tiny"


@pytest.mark.slow
def test_serve_help_lists_options():
    out = subprocess.run(
        [sys.executable, "-m", "vriksha.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for flag in (
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--max-waiting",
        "--served-model-name",
        "--profile-dir",
    ):
        assert flag in out.stdout


@pytest.mark.slow
def test_sigterm_drains_then_exits_zero(server_factory, tiny_model_dir):
    server = server_factory(
        [
            "--model",
            str(tiny_model_dir),
            "--kv-cache-memory-gb",
            "0.05",
            "--served-model-name",
            MODEL,
            "--shutdown-timeout",
            "2",
        ]
    )
    results: dict[str, list[str]] = {}
    cut: dict[str, httpx.Response] = {}

    def stream(name: str, max_tokens: int) -> None:
        body = {
            "model": MODEL,
            "prompt": "Hello",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        lines: list[str] = []
        try:
            with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        if len(lines) == 1:
                            started[name].set()
        except httpx.HTTPError as exc:
            lines.append(f"error: {type(exc).__name__}")
        results[name] = lines

    def whole(name: str, path: str, body: dict) -> None:
        started[name].set()
        try:
            cut[name] = httpx.post(f"{server.base_url}{path}", json=body, timeout=60)
        except httpx.HTTPError as exc:
            results[name] = [f"error: {type(exc).__name__}"]

    long_body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2000, "ignore_eos": True}
    started = {n: threading.Event() for n in ("short", "long", "whole", "native")}
    threads = [
        threading.Thread(target=stream, args=("short", 24)),
        threading.Thread(target=stream, args=("long", 2000)),  # far longer than the timeout
        threading.Thread(target=whole, args=("whole", "/v1/completions", long_body)),
        threading.Thread(
            target=whole,
            args=("native", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2000}}),
        ),
    ]
    for t in threads:
        t.start()
    assert all(e.wait(60) for e in started.values()), server.log_tail()
    time.sleep(0.5)  # the non-streamed requests are in the engine
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    health = httpx.get(f"{server.base_url}/health", timeout=5)  # still listening, and says it drains
    assert health.status_code == 503 and health.json()["status"] == "draining", health.text
    assert health.json()["in_flight"] >= 1, health.text
    r = httpx.post(
        f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}, timeout=5
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text
    code = server.proc.wait(timeout=60)
    elapsed = time.monotonic() - t0
    for t in threads:
        t.join(timeout=30)
    assert code == 0, server.log_tail()
    assert elapsed < 20, f"shutdown took {elapsed:.1f} s with a 2 s timeout"
    assert results["short"][-1] == "data: [DONE]", results["short"][-3:]
    # cut at the timeout: an error event, then [DONE]
    long_tail = results["long"][-2:]
    assert long_tail[-1] == "data: [DONE]", results["long"][-3:]
    event = json.loads(long_tail[0].removeprefix("data: "))
    assert event["error"]["code"] == "server_shutting_down", event
    # cut non-streamed requests: the documented JSON 503
    for name in ("whole", "native"):
        assert name in cut, results.get(name)
        r = cut[name]
        assert r.status_code == 503 and r.headers["content-type"] == "application/json", (name, r.text)
        assert r.json()["error"]["code"] == "server_shutting_down", r.text
        assert "Retry-After" in r.headers
