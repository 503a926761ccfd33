"""A routes file whose pool is a `fleet` section: `vriksha router --config` starts the pool's replicas
itself, routes to them, and stops them all when it is stopped."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.router.conftest import Proc, wait_until
from tests.server.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")]


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is `pid`."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_router_starts_routes_to_and_stops_a_fleet_pool(router_model_dir: Path, tmp_path: Path) -> None:
    routes = {
        "pools": [
            {
                "name": "small",
                "fleet": {
                    "replicas": 2,
                    "model": str(router_model_dir),
                    "serve_args": ["--no-native-kernels"],
                },
                "policy": "round_robin",
            },
        ],
        "signals": {"keyword": [{"name": "hi", "keywords": ["hello"]}]},
        "decisions": [{"name": "greeting", "when": "hi", "pool": "small", "sampling": {"max_tokens": 2}}],
        "default": {"pool": "small"},
    }
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(routes))
    port = free_port()
    cmd = [sys.executable, "-m", "vriksha.cli", "--log-level", "INFO", "router", "--config", str(path)]
    cmd += ["--port", str(port), "--health-interval", "0.3"]
    url = f"http://127.0.0.1:{port}"
    router = Proc(cmd, tmp_path / "router.log", f"{url}/health", "semantic router with a fleet pool")
    children: list[int] = []
    try:
        router.start(wait=False)
        router.wait_ready(timeout_s=900)  # two replicas start before the router binds
        assert router.proc is not None
        found = _children(router.proc.pid)
        assert len(found) == 2 and all(" serve " in cmd for _, cmd in found), found
        children = [pid for pid, _ in found]
        reps = wait_until(
            lambda: (
                (r := httpx.get(f"{url}/router/pools", timeout=5).json()["pools"]["small"]["replicas"])
                and all(x["healthy"] for x in r)
                and r
            ),
            60,
            "both fleet replicas healthy",
        )
        assert len(reps) == 2 and all(x["url"].startswith("http://127.0.0.1:") for x in reps)
        for _ in range(2):
            resp = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": "auto", "messages": [{"role": "user", "content": "hello there"}]},
                timeout=120,
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["model"] == "small"
            assert "decision=greeting" in resp.headers["x-vriksha-route"]
            assert resp.json()["usage"]["completion_tokens"] <= 2
        router.proc.send_signal(signal.SIGTERM)
        assert router.proc.wait(timeout=90) == 0, router.log_tail()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in children if _alive(p)], "fleet replicas outlived the router"
        for r in reps:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{r['url']}/health", timeout=2)
    finally:
        router.stop()
        for p in children:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
