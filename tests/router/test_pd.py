"""Prefill/decode disaggregation over real processes: `vriksha router --prefill P --replica D` computes long
prompts on P and moves their K/V into D's radix tree (greedy tokens equal a colocated replica's, D computes
only the last prompt token); short prompts skip P; an offer D never fetches is freed on P (shared memory
unlinked, stream slots unlocked); a P killed after offering leaves D with no held slots once its fetch
times out, and the request is still served."""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

from tests.router.conftest import Proc, Router, metric, wait_until
from tests.server.conftest import INTERNAL, free_port

pytestmark = pytest.mark.slow

TRADERS = (
    " Then came the traders, who brought salt and iron from the coast and stayed for the winter markets."
)
LONG = "The history of the river valley begins with the first farmers who settled along its banks. " * 4


class Serve(Proc):
    def __init__(self, model_dir, log_dir, name: str, *extra: str, events: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events = f"tcp://127.0.0.1:{free_port()}" if events else None
        cmd = [sys.executable, "-m", "vriksha.cli", "--log-level", "INFO", "serve", "--model", str(model_dir)]
        cmd += ["--port", str(self.port), "--no-native-kernels", *extra]
        if self.events:
            cmd += ["--kv-events-endpoint", self.events]
        super().__init__(cmd, log_dir / f"{name}.log", f"{self.url}/health", name)

    @property
    def spec(self) -> str:
        return f"{self.url},{self.events}" if self.events else self.url

    def transfers(self) -> dict:
        return httpx.get(f"{self.url}/kv/transfers", headers=INTERNAL, timeout=10).json()


@pytest.fixture(scope="module")
def pd(router_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd-logs")
    prefill = Serve(router_model_dir, logs, "prefill", "--role", "prefill", "--kv-transfer-hold", "5")
    decode = Serve(
        router_model_dir,
        logs,
        "decode",
        *("--role", "decode", "--kv-transfer-timeout", "2", "--kv-peer", prefill.url),
        events=True,
    )
    colocated = Serve(router_model_dir, logs, "colocated")
    procs = [prefill, decode, colocated]
    router = Router(router_model_dir, logs, [], "--prefill", prefill.url, "--pd-threshold", "16")
    router.cmd += ["--replica", decode.spec]
    try:
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_ready()
        router.start()
        wait_until(lambda: all(x["healthy"] for x in router.replicas()), 60, "replicas in rotation")
        yield prefill, decode, colocated, router
    finally:
        router.stop()
        for p in procs:
            p.stop()


def model_of(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def complete(url: str, model: str, prompt: str, max_tokens: int = 8) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_long_prompts_go_through_prefill_and_decode_as_colocated(pd) -> None:
    prefill, decode, colocated, router = pd
    model = model_of(colocated.url)
    for i, text in enumerate([LONG, LONG + TRADERS, "Once upon a time " * 12]):
        got = complete(router.url, model, text)
        want = complete(colocated.url, model, text)
        assert got["choices"][0]["text"] == want["choices"][0]["text"], i
        usage = got["usage"]
        # the decode replica computed only the prompt's last token: the rest came from the prefill replica
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    stats = decode.transfers()
    assert stats["role"] == "decode" and stats["decode"]["pulls"] >= 3
    assert stats["decode"]["reservations"] == 0 and stats["pool"]["locked_tokens"] == 0
    m = router.metrics()
    assert metric(m, "vriksha_router_pd_transfers_total", status="ok") >= 3
    assert metric(m, "vriksha_router_pd_fetched_tokens_total") > 0
    wait_until(lambda: prefill.transfers()["prefill"]["offers"] == 0, 10, "offers released")
    assert prefill.transfers()["prefill"]["released"] >= 3
    # chat goes the same way
    body = {
        "model": model,
        "messages": [{"role": "user", "content": LONG}],
        "max_tokens": 6,
        "temperature": 0,
    }
    a = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=120).json()
    b = httpx.post(f"{colocated.url}/v1/chat/completions", json=body, timeout=120).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_short_prompts_skip_prefill(pd) -> None:
    prefill, decode, colocated, router = pd
    model = model_of(colocated.url)
    before = decode.transfers()["decode"]
    offered = prefill.transfers()["prefill"]["offered"]
    got = complete(router.url, model, "Hi there", max_tokens=4)
    assert (
        got["choices"][0]["text"]
        == complete(colocated.url, model, "Hi there", max_tokens=4)["choices"][0]["text"]
    )
    assert decode.transfers()["decode"]["pulls"] == before["pulls"]
    assert prefill.transfers()["prefill"]["offered"] == offered


def test_unfetched_offers_are_freed_on_the_prefill_side(pd) -> None:
    prefill, _, _, _ = pd
    tokens = list(range(100, 160))
    expired = prefill.transfers()["prefill"]["expired"]
    body = {"token_ids": tokens, "start": 0, "transports": ["stream"], "host_id": "", "hold_s": 4}
    resp = httpx.post(f"{prefill.url}/kv/prefill", json=body, timeout=60, headers=INTERNAL)
    assert resp.status_code == 200, resp.text
    assert prefill.transfers()["pool"]["locked_tokens"] > 0  # the stream offer holds its slots
    body["transports"] = ["shm"]  # shared memory needs the decode side on this host: an empty id is elsewhere
    resp = httpx.post(f"{prefill.url}/kv/prefill", json=body, timeout=60, headers=INTERNAL)
    assert resp.status_code == 502 and "no K/V transport in common" in resp.text
    body["host_id"] = _host_id()
    resp = httpx.post(f"{prefill.url}/kv/prefill", json=body, timeout=60, headers=INTERNAL)
    assert resp.status_code == 200, resp.text
    name = resp.json()["info"]["name"]
    if os.path.isdir("/dev/shm"):
        assert os.path.exists(f"/dev/shm/{name}")
    wait_until(lambda: prefill.transfers()["prefill"]["offers"] == 0, 20, "offers expired")
    after = prefill.transfers()
    assert after["prefill"]["expired"] == expired + 2
    assert after["pool"]["locked_tokens"] == 0
    assert not os.path.exists(f"/dev/shm/{name}")


def _host_id() -> str:
    from vriksha.engine.kv_transfer import host_id

    return host_id()


def test_transfer_endpoints_refuse_bad_input(pd) -> None:
    prefill, decode, colocated, _ = pd
    wrong = httpx.post(
        f"{colocated.url}/kv/pull",
        json={"token_ids": [1, 2], "prefill_url": "http://x"},
        timeout=10,
        headers=INTERNAL,
    )
    assert wrong.status_code == 404 and "--role decode" in wrong.json()["error"]["message"]
    wrong = httpx.post(f"{decode.url}/kv/prefill", json={"token_ids": [1, 2]}, timeout=10, headers=INTERNAL)
    assert wrong.status_code == 404 and "--role prefill" in wrong.json()["error"]["message"]
    both = httpx.post(
        f"{decode.url}/kv/pull",
        json={"token_ids": [1], "prefill_url": "http://x", "offer": {}},
        timeout=10,
        headers=INTERNAL,
    )
    assert both.status_code == 502 and "exactly one" in both.json()["error"]["message"]
    empty = httpx.post(f"{prefill.url}/kv/prefill", json={"token_ids": []}, timeout=10, headers=INTERNAL)
    assert empty.status_code == 400
    forged = {
        "token_ids": list(range(10, 60)),
        "offer": {"transfer_id": "x", "transport": "shm", "num_tokens": 50},
    }
    assert httpx.post(f"{decode.url}/kv/pull", json=forged, timeout=10, headers=INTERNAL).status_code == 502
    forged["offer"] |= {"start": 0, "host_id": "", "layout": {}, "info": {"name": "../etc"}}
    bad = httpx.post(f"{decode.url}/kv/pull", json=forged, timeout=10, headers=INTERNAL)
    assert bad.status_code == 502
    assert decode.transfers()["decode"]["reservations"] == 0


def test_killed_prefill_replica_frees_the_decode_side(pd) -> None:
    """Last in the module: it kills the module's prefill replica."""
    prefill, decode, colocated, router = pd
    tokens = list(range(300, 380))
    body = {"token_ids": tokens, "start": 0, "transports": ["stream"], "host_id": _host_id(), "hold_s": 60}
    offer = httpx.post(f"{prefill.url}/kv/prefill", json=body, timeout=60, headers=INTERNAL)
    assert offer.status_code == 200, offer.text
    prefill.kill()  # gone with the K/V the decode replica is about to fetch
    t0 = time.monotonic()
    pull = httpx.post(
        f"{decode.url}/kv/pull",
        json={"token_ids": tokens, "offer": offer.json()},
        timeout=60,
        headers=INTERNAL,
    )
    assert pull.status_code == 502 and "kv_transfer_failed" in pull.text
    assert time.monotonic() - t0 < 15  # the fetch timeout (2 s here), not a hang
    stats = decode.transfers()
    assert stats["decode"]["reservations"] == 0 and stats["decode"]["reserved_tokens"] == 0
    assert stats["pool"]["locked_tokens"] == 0
    pool = stats["pool"]
    assert pool["free_slots"] + pool["cached_tokens"] == pool["capacity"]  # nothing stranded
    # through the router a dead prefill replica costs only time: the decode replica computes the prompt
    model = model_of(colocated.url)
    text = LONG + " A different ending."
    ok_before = metric(router.metrics(), "vriksha_router_pd_transfers_total", status="ok")
    got = complete(router.url, model, text)
    assert got["choices"][0]["text"] == complete(colocated.url, model, text)["choices"][0]["text"]
    assert metric(router.metrics(), "vriksha_router_pd_transfers_total", status="ok") == ok_before
