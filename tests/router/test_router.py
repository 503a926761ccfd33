"""`vriksha router` over two real replicas: the OpenAI surface passes through (streaming included), bad input
gets the replica's own 4xx, `precise` follows the prefix, sessions stick, the mirror equals the replica's
tree, and a lost event batch is noticed and resynced."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.router.conftest import Router, metric, wait_until
from tests.server.conftest import INTERNAL, INTERNAL_KEY
from vriksha.router.subscriber import EventSubscriber

pytestmark = pytest.mark.slow

MODEL = "router-tiny"  # set from the model directory's name below
LONG = "The history of the river valley begins with the first farmers who settled along its banks " * 3


@pytest.fixture(scope="module")
def router(replicas, router_model_dir, tmp_path_factory):
    r = Router(router_model_dir, tmp_path_factory.mktemp("router"), replicas)
    try:
        r.start()
        wait_until(
            lambda: all(x["healthy"] and x["events"]["synced"] for x in r.replicas()), 60, "replicas synced"
        )
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def model_name(replicas) -> str:
    return httpx.get(f"{replicas[0].url}/v1/models", timeout=10).json()["data"][0]["id"]


def complete(
    url: str, model: str, prompt: str, headers: dict[str, str] | None = None, **kw
) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, **kw}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120, headers=headers or {})
    assert resp.status_code == 200, resp.text
    return resp


def test_completions_chat_and_streams_pass_through(router, model_name) -> None:
    resp = complete(router.url, model_name, "Hello there")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert resp.headers["x-vriksha-replica"].startswith("http://127.0.0.1:")
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=120) as s:
        assert s.status_code == 200
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    models = httpx.get(f"{router.url}/v1/models", timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == model_name


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "x", "bogus": 1}),
        ("/v1/completions", {"prompt": ""}),
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}),
        ("/v1/completions", {"prompt": "x", "model": "no-such-model"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}),
        ("/v1/completions", "{not json"),
        ("/v1/completions", ""),
    ],
)
def test_bad_input_gets_the_replicas_4xx(router, replicas, model_name, path, body) -> None:
    if isinstance(body, dict):
        body = json.dumps({"model": model_name, **body})
    headers = {"content-type": "application/json"}
    direct = httpx.post(f"{replicas[0].url}{path}", content=body, headers=headers, timeout=30)
    routed = httpx.post(f"{router.url}{path}", content=body, headers=headers, timeout=30)
    assert 400 <= direct.status_code < 500
    assert routed.status_code == direct.status_code
    assert routed.json() == direct.json()


def test_precise_keeps_a_shared_prefix_on_one_replica(router, model_name) -> None:
    first = complete(router.url, model_name, LONG + "Question 0?")
    holder = first.headers["x-vriksha-replica"]
    wait_until(
        lambda: any(r["url"] == holder and r["events"]["tokens"] > 40 for r in router.replicas()),
        30,
        "events",
    )
    cached = []
    for i in range(1, 5):
        resp = complete(router.url, model_name, LONG + f"Question {i}?")
        assert resp.headers["x-vriksha-replica"] == holder
        cached.append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert min(cached) > 40
    assert metric(router.metrics(), "vriksha_router_decisions_total", reason="prefix", replica=holder) >= 4


def test_session_header_pins_a_replica(router, model_name) -> None:
    seen = set()
    for i in range(4):
        resp = complete(
            router.url, model_name, f"unrelated prompt number {i} " * (i + 1), headers={"x-session-id": "s1"}
        )
        seen.add(resp.headers["x-vriksha-replica"])
    assert len(seen) == 1


def test_a_body_session_id_keeps_the_session_on_its_replica_and_close_reaches_it(router, model_name) -> None:
    seen = set()
    for i in range(4):
        resp = complete(router.url, model_name, f"another unrelated prompt {i} " * (i + 1), session_id="s2")
        seen.add(resp.headers["x-vriksha-replica"])
    assert len(seen) == 1
    closed = httpx.post(f"{router.url}/close_session", json={"session_id": "s2"}, timeout=30)
    assert closed.status_code == 200 and closed.json()["closed"] is True
    assert closed.headers["x-vriksha-replica"] == seen.pop()


def test_mirror_equals_the_replica_tree(router, replicas, model_name) -> None:
    for i in range(3):
        complete(router.url, model_name, f"mirror check {i} " + LONG[: 40 * (i + 1)])

    def equal(i: int) -> bool:
        snap = replicas[i].snapshot()
        mine = httpx.get(
            f"{router.url}/router/mirror", params={"replica": i}, headers=INTERNAL, timeout=10
        ).json()
        return mine["seq"] == snap["seq"] and mine["paths"] == sorted(snap["paths"])

    for i in range(len(replicas)):
        wait_until(lambda i=i: equal(i), 30, f"the mirror of replica {i} to equal its tree")


class LossySubscriber(EventSubscriber):
    """Drops the batch numbered `drop` on the way in, as a lossy network would."""

    drop = -1

    def on_message(self, seq, batch) -> None:
        if self.synced and self.drop < 0 and seq > self.seq:
            self.drop = seq
            return
        super().on_message(seq, batch)


def test_a_lost_batch_is_noticed_and_resynced(replicas, model_name) -> None:
    r = replicas[1]
    reasons: list[str] = []

    async def run() -> None:
        async with httpx.AsyncClient() as http:
            sub = LossySubscriber(
                "r1",
                r.events,
                f"{r.url}/kv_events/snapshot",
                http,
                on_resync=reasons.append,
                internal_key=INTERNAL_KEY,
            )
            sub.start()
            try:
                await _until(lambda: sub.synced, 30)
                for i in range(3):
                    body = {"model": model_name, "prompt": f"lossy {i} " + LONG, "max_tokens": 1}
                    assert (
                        await http.post(f"{r.url}/v1/completions", json=body, timeout=120)
                    ).status_code == 200
                await _until(lambda: "gap" in reasons and sub.synced, 30)
                snap = (await http.get(f"{r.url}/kv_events/snapshot", headers=INTERNAL)).json()
                await _until(lambda: sub.seq >= snap["seq"], 30)
                assert sub.tree.paths() == {tuple(p) for p in snap["paths"]} or sub.seq > snap["seq"]
            finally:
                await sub.stop()
        assert sub.drop >= 0

    asyncio.run(run())
    assert reasons[0] == "start" and "gap" in reasons


async def _until(check, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_metrics_count_per_replica(router, replicas) -> None:
    text = router.metrics()
    for r in replicas:
        assert metric(text, "vriksha_router_replica_healthy", replica=r.url) == 1.0
    assert metric(text, "vriksha_router_requests_total") >= 1
    assert metric(text, "vriksha_router_overhead_seconds_count") >= 1


def test_api_key_as_vriksha_serve(replicas, router_model_dir, model_name, tmp_path) -> None:
    r = Router(router_model_dir, tmp_path, replicas, "--api-key", "sesame", name="router-auth")
    try:
        r.start()
        body = {"model": model_name, "prompt": "Hi", "max_tokens": 1}
        denied = httpx.post(f"{r.url}/v1/completions", json=body, timeout=30)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.post(
            f"{r.url}/v1/completions", json=body, headers={"Authorization": "Bearer x"}, timeout=30
        )
        assert wrong.status_code == 401
        ok = httpx.post(
            f"{r.url}/v1/completions", json=body, headers={"Authorization": "Bearer sesame"}, timeout=60
        )
        assert ok.status_code == 200, ok.text
        assert httpx.get(f"{r.url}/health", timeout=10).status_code == 200  # exempt, as on a replica
    finally:
        r.stop()
