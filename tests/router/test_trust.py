"""Who may call what across a fleet, attacked as a client holding the API key would: the replica-to-replica
endpoints and streams take the internal key only (a forged K/V offer, an attacker's `prefill_url`, a snapshot
or a plain subscription to the event stream all get nothing), a router with `--api-key` in front of replicas
with `--api-key` serves, and a hung prefill replica costs a bounded time."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
import zmq

from tests.router.conftest import Router, wait_until
from tests.router.test_pd import LONG, Serve
from tests.server.conftest import INTERNAL

pytestmark = pytest.mark.slow

API_KEY = "sk-trust-test-client"
USER = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def fleet(router_model_dir, tmp_path_factory):
    """A prefill and a decode replica and a router, all with the client API key and the internal key (the
    router polls rarely, so a stopped prefill replica stays in rotation for the last test)."""
    logs = tmp_path_factory.mktemp("trust-logs")
    prefill = Serve(router_model_dir, logs, "prefill", "--role", "prefill", "--api-key", API_KEY)
    decode = Serve(
        router_model_dir,
        logs,
        "decode",
        *("--role", "decode", "--api-key", API_KEY, "--kv-peer", prefill.url, "--kv-transfer-timeout", "2"),
        events=True,
    )
    intervals = ("--health-interval", "30", "--load-interval", "30")
    router = Router(router_model_dir, logs, [], "--api-key", API_KEY, "--prefill", prefill.url, *intervals)
    router.cmd += ["--pd-threshold", "16", "--replica", decode.spec]
    procs = [prefill, decode]
    try:
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_ready()
        router.start()  # healthy only once its polls of the replicas' /load (with a key) succeed
        yield prefill, decode, router
    finally:
        if prefill.proc is not None and prefill.proc.poll() is None:
            prefill.proc.send_signal(signal.SIGCONT)
        router.stop()
        for p in procs:
            p.stop()


def _model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", headers=USER, timeout=10).json()["data"][0]["id"]


def _generate(url: str, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}
    resp = httpx.post(f"{url}/generate", json=body, headers=USER, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_router_with_an_api_key_serves_replicas_with_one(fleet) -> None:
    prefill, decode, router = fleet
    reps = httpx.get(f"{router.url}/router/replicas", headers=USER, timeout=10).json()["replicas"]
    assert all(r["healthy"] for r in reps) and len(reps) == 2
    body = {"model": _model(router.url), "prompt": LONG, "max_tokens": 2, "temperature": 0}
    resp = httpx.post(f"{router.url}/v1/completions", json=body, headers=USER, timeout=120)
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1  # P/D with the key


class _ForgedSource:
    """An attacker's K/V source: a plain ZMQ ROUTER answering any fetch with garbage of the right size."""

    def __init__(self, layout: dict) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.layout = layout
        self.asked = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        size = 4 if self.layout["dtype"] == "float32" else 2
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            ident, *parts = self.sock.recv_multipart()
            self.asked += 1
            ask = json.loads(parts[-1])
            n = ask["end"] - ask["begin"]
            frames = [json.dumps({"ok": True, "layers": len(self.layout["layers"])}).encode()]
            for heads, k_dim, v_dim in self.layout["layers"]:
                frames += [os.urandom(n * heads * k_dim * size), os.urandom(n * heads * v_dim * size)]
            self.sock.send_multipart([ident, b"", *frames])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        self.ctx.term()


class _Listener(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        type(self).seen.append(dict(self.headers))
        self.send_response(500)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_forged_kv_and_foreign_prefill_urls_are_refused(fleet) -> None:
    prefill, decode, _ = fleet
    probe = {"token_ids": list(range(500, 540)), "start": 0, "transports": ["stream"], "host_id": ""}
    offer = httpx.post(f"{prefill.url}/kv/prefill", json=probe, headers=INTERNAL, timeout=60)
    assert offer.status_code == 200, offer.text
    layout = offer.json()["layout"]
    victim = list(range(1000, 1064))
    source = _ForgedSource(layout)
    forged = {
        "token_ids": victim,
        "offer": {
            "transfer_id": "forged",
            "transport": "stream",
            "num_tokens": len(victim),
            "start": 0,
            "layout": layout,
            "host_id": "",
            "info": {"endpoint": source.endpoint},
        },
    }
    http = HTTPServer(("127.0.0.1", 0), _Listener)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    attacker_url = f"http://127.0.0.1:{http.server_address[1]}"
    try:
        for headers in (USER, {}):  # a client's key, or none: the transfer endpoints are not for clients
            resp = httpx.post(f"{decode.url}/kv/pull", json=forged, headers=headers, timeout=30)
            assert resp.status_code == 401, resp.text
            ssrf = {"token_ids": victim, "prefill_url": attacker_url}
            assert (
                httpx.post(f"{decode.url}/kv/pull", json=ssrf, headers=headers, timeout=30).status_code == 401
            )
        # even an internal caller relaying them: the stream is CURVE-keyed, the attacker's socket is not ...
        resp = httpx.post(f"{decode.url}/kv/pull", json=forged, headers=INTERNAL, timeout=30)
        assert resp.status_code == 502, resp.text
        # ... and a prefill_url must be one of the decode replica's --kv-peer
        ssrf = {"token_ids": victim, "prefill_url": attacker_url}
        resp = httpx.post(f"{decode.url}/kv/pull", json=ssrf, headers=INTERNAL, timeout=30)
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "peer_not_allowed", resp.text
        assert source.asked == 0 and _Listener.seen == []  # nothing was fetched, nothing was sent out
        assert _generate(decode.url, victim)["cached_tokens"] == 0  # nothing planted for the victim
    finally:
        source.close()
        http.shutdown()


def test_cached_prompts_are_not_readable_by_clients(fleet) -> None:
    _, decode, router = fleet
    for headers in (USER, {}):
        snap = httpx.get(f"{decode.url}/kv_events/snapshot", headers=headers, timeout=10)
        assert snap.status_code == 401, snap.text
        mirror = httpx.get(f"{router.url}/router/mirror", params={"replica": 0}, headers=headers, timeout=10)
        assert mirror.status_code in (401, 403), mirror.text
    ctx = zmq.Context()
    spies = []
    for _ in range(2):  # a plain subscriber, and one with CURVE keys of another internal key
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        spies.append(sock)
    from vriksha.net.curve import CurveKeys

    wrong = CurveKeys.from_key("not-the-internal-key-at-all")
    wrong.connect(spies[1])
    try:
        for sock in spies:
            sock.connect(decode.events)
        time.sleep(1.0)
        secret = list(range(2000, 2040))  # another client's prompt
        _generate(decode.url, secret)
        for sock in spies:
            assert not sock.poll(1500), "a subscriber without the internal key read the cache events"
        # the router, holding the key, mirrors the prompt from the same stream and snapshot
        wait_until(
            lambda: any(
                p[: len(secret)] == secret
                for p in httpx.get(
                    f"{router.url}/router/mirror", params={"replica": 0}, headers=INTERNAL, timeout=10
                ).json()["paths"]
            ),
            30,
            "the router's mirror to hold the prompt",
        )
        snap = httpx.get(f"{decode.url}/kv_events/snapshot", headers=INTERNAL, timeout=10)
        assert snap.status_code == 200 and any(p[: len(secret)] == secret for p in snap.json()["paths"])
    finally:
        for sock in spies:
            sock.close()
        ctx.term()


def test_a_hung_prefill_replica_costs_seconds(fleet) -> None:
    """Last in the module: it stops the prefill replica."""
    prefill, decode, router = fleet
    before = httpx.get(f"{decode.url}/kv/transfers", headers=INTERNAL, timeout=10).json()["decode"][
        "failures"
    ]
    assert prefill.proc is not None
    prefill.proc.send_signal(signal.SIGSTOP)  # accepts connections (the kernel's backlog), answers nothing
    try:
        body = {
            "model": _model(decode.url),
            "prompt": "While the prefill replica hangs: " + LONG,
            "max_tokens": 2,
        }
        t0 = time.monotonic()
        resp = httpx.post(f"{router.url}/v1/completions", json=body, headers=USER, timeout=120)
        took = time.monotonic() - t0
        assert resp.status_code == 200, resp.text
        assert took < 30, f"a hung prefill replica held the request {took:.0f} s"
        stats = httpx.get(f"{decode.url}/kv/transfers", headers=INTERNAL, timeout=10).json()["decode"]
        assert stats["failures"] == before + 1 and "--kv-prefill-timeout" in stats["last_error"]
        assert (
            resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        )  # computed by the decode side
    finally:
        prefill.proc.send_signal(signal.SIGCONT)
