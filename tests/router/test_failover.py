"""Replica failures behind `vriksha router`: kill -9 under load ends every stream on it with an error event (no
client hangs, the other replica's clients see nothing), requests that had no output yet are retried, the dead
replica is ejected, and re-admitted with an empty mirror when it comes back."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.router.conftest import Replica, Router, metric, wait_until

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def pair(router_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("failover")
    reps = [Replica(router_model_dir, log_dir, i, vllm_events=False) for i in range(2)]
    try:
        for r in reps:
            r.start(wait=False)
        for r in reps:
            r.wait_ready()
        yield reps, log_dir
    finally:
        for r in reps:
            r.stop()


def model_of(r: Replica) -> str:
    return httpx.get(f"{r.url}/v1/models", timeout=10).json()["data"][0]["id"]


def stream_once(url: str, model: str, i: int, progress: dict[int, dict] | None = None) -> dict:
    """One streaming completion; what came back, however it ended (also in `progress[i]` as it comes)."""
    body = {"model": model, "prompt": f"story {i}: once upon a time", "max_tokens": 400, "stream": True}
    body |= {"ignore_eos": True, "temperature": 0}
    out = {"replica": None, "chunks": 0, "error": None, "done": False, "finish": None}
    if progress is not None:
        progress[i] = out
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=CLIENT_TIMEOUT_S) as s:
        out["status"] = s.status_code
        out["replica"] = s.headers.get("x-vriksha-replica")
        for line in s.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                out["error"] = event["error"]["message"]
                continue
            out["chunks"] += 1
            out["finish"] = event["choices"][0]["finish_reason"] or out["finish"]
    return out


def test_kill_under_load_then_restart(pair, router_model_dir) -> None:
    (a, b), log_dir = pair
    model = model_of(a)
    router = Router(router_model_dir, log_dir, [a, b], "--policy", "round_robin")
    try:
        router.start()
        wait_until(lambda: all(x["healthy"] for x in router.replicas()), 60, "both replicas healthy")
        progress: dict[int, dict] = {}
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(stream_once, router.url, model, i, progress) for i in range(6)]

            def streaming_on_b() -> bool:  # output has come, the stream has not ended: kill now
                live = [o for o in list(progress.values()) if o["replica"] == b.url and not o["done"]]
                return sum(o["chunks"] > 0 for o in live) >= 2

            wait_until(streaming_on_b, 60, "two streams producing on replica b", interval_s=0.005)
            ended_before_kill = {i for i, o in list(progress.items()) if o["done"]}
            b.kill()
            results = [f.result(timeout=CLIENT_TIMEOUT_S) for f in futures]
        on_a = [r for r in results if r["replica"] == a.url]
        on_b = [r for i, r in enumerate(results) if r["replica"] == b.url and i not in ended_before_kill]
        assert on_a and len(on_b) >= 2
        for r in on_a:  # the other replica's clients see nothing
            assert r["done"] and r["error"] is None and r["finish"] == "length", r
        for r in on_b:  # streamed, then a clear error event and the end of the stream
            assert r["done"] and r["error"] and "failed mid-stream" in r["error"], r
        wait_until(lambda: not router.replicas()[1]["healthy"], 10, "replica b ejected")
        for i in range(4):  # nothing goes to the dead replica
            resp = httpx.post(
                f"{router.url}/v1/completions",
                json={"model": model, "prompt": f"after {i}", "max_tokens": 2},
                timeout=60,
            )
            assert resp.status_code == 200 and resp.headers["x-vriksha-replica"] == a.url
        before = router.replicas()[1]["events"]["instance"]

        b.start()  # the same ports, an empty cache
        wait_until(lambda: router.replicas()[1]["healthy"], 60, "replica b re-admitted")
        rb = wait_until(
            lambda: (
                (x := router.replicas()[1])["events"]["synced"] and x["events"]["instance"] != before and x
            ),
            30,
            "the restart noticed",
        )
        assert rb["events"]["tokens"] == 0
        text = router.metrics()
        assert metric(text, "vriksha_router_ejections_total", replica=b.url) >= 1
        assert metric(text, "vriksha_router_readmissions_total", replica=b.url) >= 1
        assert metric(text, "vriksha_router_stream_errors_total", replica=b.url) == len(on_b)
        seen = set()
        for i in range(4):
            resp = httpx.post(
                f"{router.url}/v1/completions",
                json={"model": model, "prompt": f"back {i}", "max_tokens": 2},
                timeout=60,
            )
            assert resp.status_code == 200
            seen.add(resp.headers["x-vriksha-replica"])
        assert seen == {a.url, b.url}
    finally:
        router.stop()
        if b.proc is None or b.proc.poll() is not None:  # failed before the restart: the next test needs b
            b.start(wait=False)


def test_requests_without_output_are_retried_elsewhere(pair, router_model_dir) -> None:
    (a, b), log_dir = pair
    model = model_of(a)
    # polls once at start only: the router learns of the death from the requests themselves
    router = Router(
        router_model_dir,
        log_dir,
        [a, b],
        "--policy",
        "round_robin",
        "--load-interval",
        "600",
        "--health-interval",
        "600",
        name="router-retry",
    )
    try:
        router.start()
        wait_until(lambda: all(x["healthy"] for x in router.replicas()), 60, "both replicas healthy")
        b.kill()
        for i in range(3):
            body = {"model": model, "prompt": f"retry {i}", "max_tokens": 2, "stream": i == 1}
            resp = httpx.post(f"{router.url}/v1/completions", json=body, timeout=60)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-vriksha-replica"] == a.url
            assert "error" not in resp.text
        assert metric(router.metrics(), "vriksha_router_retries_total", replica=b.url) == 1
        assert not router.replicas()[1]["healthy"]
    finally:
        router.stop()
        b.start(wait=False)
