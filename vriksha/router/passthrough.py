"""The router's answers to requests that need no replica choice: the tokenizer and model endpoints (GET
/v1/models, /v1/models/{id}, /tokenizer_info; POST /tokenize, /detokenize, /v1/embeddings) go to any healthy
replica, as they would be answered by each; /close_session goes to the replica the session was routed to;
GET /v1/responses/{id} to the replica that stored it; /version and /ping are the router's own."""

from __future__ import annotations

import json

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import vriksha
from vriksha.router.pool import ReplicaPool
from vriksha.router.proxy import REPLICA_HEADER, NoReplicaError, forwarded_headers

_RETURNED = ("content-type", "retry-after", "x-request-id")
ANY_REPLICA_GET = ("/v1/models", "/v1/models/{model_id:path}", "/tokenizer_info")
ANY_REPLICA_POST = ("/tokenize", "/detokenize", "/v1/embeddings")


def install(app: FastAPI, pool: ReplicaPool, http: httpx.AsyncClient) -> None:
    async def any_replica(request: Request) -> Response:
        body = await request.body()
        headers = forwarded_headers(request.headers)
        target = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path  # as sent
        for r in pool.healthy():
            try:
                resp = await http.request(request.method, f"{r.url}{target}", content=body, headers=headers)
            except httpx.TransportError:
                continue
            returned = {k: v for k, v in resp.headers.items() if k.lower() in _RETURNED}
            return Response(resp.content, resp.status_code, headers={**returned, REPLICA_HEADER: r.url})
        raise NoReplicaError("no replica is healthy; retry shortly", headers={"Retry-After": "1"})

    @app.post("/close_session")
    async def close_session(request: Request) -> Response:
        """To the replica the session was routed to (any healthy one when the router does not know it)."""
        body = await request.body()
        session = request.headers.get(pool.config.session_header)
        if session is None and body.strip():
            try:
                session = json.loads(body).get("session_id")
            except (ValueError, AttributeError):
                session = None
        index = pool.sessions.pop(session, None) if isinstance(session, str) else None
        holder = next((r for r in pool.healthy() if r.index == index), None)
        if holder is None:
            return await any_replica(request)
        headers = forwarded_headers(request.headers)
        try:
            resp = await http.post(f"{holder.url}/close_session", content=body, headers=headers)
        except httpx.TransportError:
            raise NoReplicaError(
                f"the session's replica {holder.url} did not answer; retry shortly"
            ) from None
        returned = {k: v for k, v in resp.headers.items() if k.lower() in _RETURNED}
        return Response(resp.content, resp.status_code, headers={**returned, REPLICA_HEADER: holder.url})

    @app.get("/v1/responses/{response_id}")
    async def stored_response(request: Request) -> Response:
        """A stored response is on the replica that answered it: each healthy one is asked in turn."""
        headers = forwarded_headers(request.headers)
        last: httpx.Response | None = None
        for r in pool.healthy():
            try:
                resp = await http.get(f"{r.url}{request.url.path}", headers=headers)
            except httpx.TransportError:
                continue
            last = resp
            if resp.status_code != 404:
                break
        if last is None:
            raise NoReplicaError("no replica is healthy; retry shortly", headers={"Retry-After": "1"})
        returned = {k: v for k, v in last.headers.items() if k.lower() in _RETURNED}
        return Response(last.content, last.status_code, headers=returned)

    for path in ANY_REPLICA_GET:
        app.add_api_route(path, any_replica, methods=["GET"])
    for path in ANY_REPLICA_POST:
        app.add_api_route(path, any_replica, methods=["POST"])

    @app.get("/version")
    async def version() -> Response:
        return JSONResponse({"version": vriksha.__version__})

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        healthy = len(pool.healthy())
        body = {"status": "ok" if healthy else "no_healthy_replica", "healthy": healthy}
        return JSONResponse(body, status_code=200 if healthy else 503)
