"""`vriksha fleet`: two pinned replicas and a router from one command; SIGTERM stops every one of them."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from tests.router.conftest import REPO, _env, free_port, wait_until
from vriksha.router.fleet import core_shares

pytestmark = pytest.mark.slow


def test_core_shares_split_evenly_and_wrap() -> None:
    assert core_shares([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert core_shares([0, 1], 2) == [[0], [1]]
    assert core_shares([0, 1], 3) == [[0], [1], [0]]


def test_fleet_serves_and_stops_cleanly(router_model_dir, tmp_path) -> None:
    port = free_port()
    log = open(tmp_path / "fleet.log", "wb")
    cmd = [sys.executable, "-m", "vriksha.cli", "--log-level", "INFO", "fleet", "--replicas", "2"]
    cmd += ["--model", str(router_model_dir), "--port", str(port), "--", "--no-native-kernels"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=str(REPO))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 400, "the fleet's router"
        )
        reps = wait_until(
            lambda: (
                (r := httpx.get(f"{url}/router/replicas", timeout=5).json()["replicas"])
                and all(x["healthy"] and x["events"]["synced"] for x in r)
                and r
            ),
            60,
            "both replicas in rotation",
        )
        assert len(reps) == 2
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        resp = httpx.post(
            f"{url}/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2}, timeout=60
        )
        assert resp.status_code == 200, resp.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
        for r in [{"url": url}, *reps]:  # nothing answers any more
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{r['url']}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        print((tmp_path / "fleet.log").read_text()[-3000:])


def test_fleet_with_prefill_and_decode_roles(router_model_dir, tmp_path) -> None:
    port = free_port()
    log = open(tmp_path / "fleet-pd.log", "wb")
    cmd = [
        sys.executable,
        "-m",
        "vriksha.cli",
        "--log-level",
        "INFO",
        "fleet",
        "--prefill",
        "1",
        "--decode",
        "1",
    ]
    cmd += ["--pd-threshold", "16", "--model", str(router_model_dir), "--port", str(port)]
    cmd += ["--", "--no-native-kernels"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=str(REPO))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 400, "the fleet's router"
        )
        reps = wait_until(
            lambda: (
                (r := httpx.get(f"{url}/router/replicas", timeout=5).json()["replicas"])
                and all(x["healthy"] for x in r)
                and r
            ),
            60,
            "both replicas in rotation",
        )
        assert sorted(x["role"] for x in reps) == ["decode", "prefill"]
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        prompt = "The river valley was settled by farmers who planted wheat along its banks. " * 3
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        assert (
            usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        )  # prefilled elsewhere
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        print((tmp_path / "fleet-pd.log").read_text()[-3000:])
