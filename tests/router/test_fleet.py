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
    assert proc.env is not None
    proc.env.pop("VRIKSHA_INTERNAL_KEY", None)  # the fleet makes its members' internal key itself
    try:
        proc.start(wait=False)
        wait_until(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 400, proc.name)
        yield proc, url
    finally:
        proc.stop()
        print(proc.log_tail(3000))


def in_rotation(url: str, synced: bool, headers: dict | None = None) -> list[dict]:
    return wait_until(
        lambda: (
            (r := httpx.get(f"{url}/router/replicas", headers=headers, timeout=5).json()["replicas"])
            and all(x["healthy"] and (not synced or (x["events"] or {"synced": True})["synced"]) for x in r)
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


def test_fleet_with_prefill_and_decode_roles_and_an_api_key(router_model_dir, tmp_path) -> None:
    """`--api-key` on a fleet: the router polls its replicas with credentials (it used to poll /load without
    the key, and no replica ever came into rotation), and P/D runs on the fleet's own internal key."""
    key = "sk-fleet-client"
    user = {"authorization": f"Bearer {key}"}
    args = ("--prefill", "1", "--decode", "1", "--pd-threshold", "16", "--api-key", key)
    with fleet(router_model_dir, tmp_path / "fleet-pd.log", *args) as (proc, url):
        reps = in_rotation(url, synced=True, headers=user)
        assert sorted(x["role"] for x in reps) == ["decode", "prefill"]
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        model = httpx.get(f"{url}/v1/models", headers=user, timeout=10).json()["data"][0]["id"]
        prompt = "The river valley was settled by farmers who planted wheat along its banks. " * 3
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
        resp = httpx.post(f"{url}/v1/completions", json=body, headers=user, timeout=120)
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        assert (
            usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        )  # prefilled elsewhere
        stops_on_sigterm(proc)
