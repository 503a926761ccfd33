"""`vriksha fleet`: two pinned replicas and a router from one command; SIGTERM stops every one of them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.router.conftest import Proc, free_port, wait_until
from vriksha.net.launch import vriksha_command
from vriksha.router.fleet import core_shares

pytestmark = pytest.mark.slow


@contextmanager
def fleet(model_dir: Path, log_path: Path, *args: str) -> Iterator[tuple[Proc, str]]:
    """`vriksha fleet ARGS` over the tiny model, its router's URL once it answers; stopped however the test ends."""
    port = free_port()
    cmd = vriksha_command("fleet", *args, "--model", str(model_dir), "--port", str(port), log_level="INFO")
    url = f"http://127.0.0.1:{port}"
    proc = Proc([*cmd, "--", "--no-native-kernels"], log_path, f"{url}/health", "the fleet's router")
    try:
        proc.start(wait=False)
        wait_until(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 400, proc.name)
        yield proc, url
    finally:
        proc.stop()
        print(proc.log_tail(3000))


def in_rotation(url: str, synced: bool) -> list[dict]:
    return wait_until(
        lambda: (
            (r := httpx.get(f"{url}/router/replicas", timeout=5).json()["replicas"])
            and all(x["healthy"] and (not synced or x["events"]["synced"]) for x in r)
            and r
        ),
        60,
        "both replicas in rotation",
    )


def stops_on_sigterm(proc: Proc) -> None:
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(timeout=90) == 0


def test_core_shares_split_evenly_and_wrap() -> None:
    assert core_shares([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert core_shares([0, 1], 2) == [[0], [1]]
    assert core_shares([0, 1], 3) == [[0], [1], [0]]


def test_fleet_serves_and_stops_cleanly(router_model_dir, tmp_path) -> None:
    with fleet(router_model_dir, tmp_path / "fleet.log", "--replicas", "2") as (proc, url):
        reps = in_rotation(url, synced=True)
        assert len(reps) == 2
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        resp = httpx.post(
            f"{url}/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2}, timeout=60
        )
        assert resp.status_code == 200, resp.text
        stops_on_sigterm(proc)
        for r in [{"url": url}, *reps]:  # nothing answers any more
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{r['url']}/health", timeout=2)


def test_fleet_with_prefill_and_decode_roles(router_model_dir, tmp_path) -> None:
    args = ("--prefill", "1", "--decode", "1", "--pd-threshold", "16")
    with fleet(router_model_dir, tmp_path / "fleet-pd.log", *args) as (proc, url):
        reps = in_rotation(url, synced=False)
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
        stops_on_sigterm(proc)
