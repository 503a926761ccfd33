"""The router's hot POST endpoints served as raw ASGI ahead of FastAPI (vriksha/router/fast_path.py): the same
answers as FastAPI's own route for them (error bodies, status codes, headers), the key check on them, other
methods and paths still FastAPI's; then, through a real `vriksha router` process over a stub upstream, plain
and streamed answers, a replica's 4xx and the metrics passed through as before."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import httpx
import pytest
from fastapi import FastAPI

from tests.router.conftest import Proc, metric
from tests.server.conftest import free_port
from vriksha.net.launch import vriksha_command
from vriksha.router.app import create_router_app
from vriksha.router.config import ReplicaSpec, RouterConfig

JSON = {"content-type": "application/json"}

# (path, raw body): each refused before any replica is asked; the last ones are valid but no replica is up
BAD = [
    ("/v1/completions", b'{"model": "m", '),
    ("/v1/completions", b""),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": "many"}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 1.5}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "bogus": 1}'),
    ("/v1/completions", b'{"model": "m", "prompt": "\\ud800"}'),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}'),
    ("/v1/chat/completions", b'{"model": "m"}'),
    ("/generate", b'{"input_ids": "abc"}'),
    ("/v1/completions", b'{"model": "m", "prompt": "Hi", "max_tokens": 1}'),
    ("/generate", b'{"input_ids": [1, 2, 3]}'),
]


@pytest.fixture(scope="module")
def app() -> FastAPI:
    # not started: no replica is ever healthy, so a valid request gets the router's 503
    return create_router_app(RouterConfig(replicas=[ReplicaSpec("http://127.0.0.1:9")], api_key=None))


def call(asgi, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            return await client.request(method, path, content=body, headers=headers or JSON)

    return asyncio.run(go())


def fastapi_only(app: FastAPI):
    """The same app with every request through FastAPI's stack (its route for a hot path, same handler)."""
    return lambda scope, receive, send: FastAPI.__call__(app, scope, receive, send)


@pytest.mark.parametrize("path,body", BAD)
def test_raw_path_answers_as_the_fastapi_route(app, path, body) -> None:
    raw = call(app, "POST", path, body)
    via_fastapi = call(fastapi_only(app), "POST", path, body)
    assert raw.status_code == via_fastapi.status_code
    assert raw.json() == via_fastapi.json()
    assert raw.headers.get("retry-after") == via_fastapi.headers.get("retry-after")
    err = raw.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if raw.status_code == 503:
        assert err["code"] == "no_healthy_replica" and raw.headers["retry-after"] == "1"
    else:
        assert raw.status_code == 400 and err["type"] == "invalid_request_error"


def test_error_bodies_name_the_problem(app) -> None:
    bad_json = call(app, "POST", "/v1/completions", b'{"model": ').json()["error"]
    assert "not valid JSON" in bad_json["message"]
    wrong_type = call(app, "POST", "/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": "3"}')
    assert wrong_type.json()["error"]["param"] == "max_tokens"
    unknown = call(app, "POST", "/v1/completions", b'{"model": "m", "prompt": "x", "nope": 1}').json()
    assert unknown["error"]["message"] == "unrecognized request argument supplied: nope"
    missing = call(app, "POST", "/v1/chat/completions", b'{"model": "m"}').json()
    assert "missing required parameter: messages" in missing["error"]["message"]


def test_other_methods_and_paths_reach_fastapi(app) -> None:
    get = call(app, "GET", "/v1/completions")
    assert get.status_code == 405 and get.json()["error"]["code"] == "method_not_allowed"
    assert call(app, "POST", "/v1/nothing", b"{}").json()["error"]["code"] == "not_found"
    health = call(app, "GET", "/health")
    assert health.status_code == 503 and health.json()["status"] == "no_healthy_replica"
    assert call(app, "GET", "/router/replicas").json()["policy"] == "precise"


def test_the_api_key_covers_the_raw_path() -> None:
    app = create_router_app(RouterConfig(replicas=[ReplicaSpec("http://127.0.0.1:9")], api_key="k"))
    body = b'{"model": "m", "prompt": "Hi"}'
    refused = call(app, "POST", "/v1/completions", body)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json() == call(fastapi_only(app), "POST", "/v1/completions", body).json()
    wrong = call(app, "POST", "/v1/completions", body, {**JSON, "authorization": "Bearer no"})
    assert wrong.status_code == 401
    let_in = call(app, "POST", "/v1/completions", body, {**JSON, "authorization": "Bearer k"})
    assert let_in.status_code == 503  # past the key check, to the router's own answer
    assert call(app, "GET", "/health").status_code == 503  # exempt: not a 401


STUB = textwrap.dedent(
    """
    import sys, json, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response, JSONResponse, StreamingResponse
    from starlette.routing import Route
    CHUNKS = [b'data: {"n": 0}\\n\\n', b'data: {"n": 1}\\n\\n', b"data: [DONE]\\n\\n"]
    async def chunks():
        for c in CHUNKS:
            yield c
    async def answer(request):
        body = json.loads(await request.body())
        if body.get("model") == "missing":
            err = {"error": {"message": "no such model", "type": "invalid_request_error", "param": "model",
                             "code": "model_not_found"}}
            return JSONResponse(err, status_code=404, headers={"x-request-id": "r1"})
        if body.get("stream"):
            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse({"path": request.url.path, "body": body, "auth": request.headers.get("authorization")})
    async def load(request):
        return JSONResponse({"num_running": 0, "num_waiting": 0, "kv_usage": 0.0})
    async def health(request):
        return JSONResponse({"status": "ok"})
    paths = ("/v1/completions", "/v1/chat/completions", "/generate")
    app = Starlette(routes=[*(Route(p, answer, methods=["POST"]) for p in paths), Route("/load", load),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """A `vriksha router` process over one stub upstream: (router url, upstream url)."""
    logs = tmp_path_factory.mktemp("fast-path")
    up_port, port = free_port(), free_port()
    up_url, url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{port}"
    up = Proc([sys.executable, "-c", STUB, str(up_port)], logs / "stub.log", f"{up_url}/health", "stub")
    cmd = vriksha_command("router", "--replica", up_url, "--policy", "round_robin", "--port", str(port))
    router = Proc(cmd + ["--health-interval", "0.3"], logs / "router.log", f"{url}/health", "router")
    try:
        up.start()
        router.start()
        yield url, up_url
    finally:
        router.stop()
        up.stop()


def test_plain_answers_and_headers_pass_through(routed) -> None:
    url, up_url = routed
    sent = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    resp = httpx.post(
        f"{url}/v1/chat/completions", json=sent, headers={"authorization": "Bearer t"}, timeout=30
    )
    assert resp.status_code == 200
    assert resp.headers["x-vriksha-replica"] == up_url
    assert resp.json() == {"path": "/v1/chat/completions", "body": sent, "auth": "Bearer t"}
    gen = httpx.post(f"{url}/generate", json={"input_ids": [1, 2]}, timeout=30)
    assert gen.status_code == 200 and gen.json()["path"] == "/generate"


def test_streams_pass_through(routed) -> None:
    url, up_url = routed
    body = {"model": "m", "prompt": "Hi", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        assert s.headers["x-vriksha-replica"] == up_url
        data = b"".join(s.iter_bytes())
    assert data == b'data: {"n": 0}\n\ndata: {"n": 1}\n\ndata: [DONE]\n\n'


def test_a_replica_4xx_and_the_metrics_pass_through(routed) -> None:
    url, up_url = routed
    before = httpx.get(f"{url}/metrics", timeout=10).text
    resp = httpx.post(f"{url}/v1/completions", json={"model": "missing", "prompt": "x"}, timeout=30)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert resp.headers["x-request-id"] == "r1" and resp.headers["x-vriksha-replica"] == up_url
    bad = httpx.post(f"{url}/v1/completions", content=b"{", headers=JSON, timeout=30)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    ok = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "x"}, timeout=30)
    assert ok.status_code == 200
    after = httpx.get(f"{url}/metrics", timeout=10).text
    name = "vriksha_router_requests_total"
    for status in ("404", "200"):
        labels = {"replica": up_url, "endpoint": "/v1/completions", "status": status}
        assert metric(after, name, **labels) == metric(before, name, **labels) + 1
    assert metric(after, "vriksha_router_overhead_seconds_count") >= 2
    assert httpx.get(f"{url}/router/replicas", timeout=10).json()["replicas"][0]["healthy"] is True
