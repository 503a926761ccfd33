"""Endpoints a router reads from a replica: `/load` (queue and KV usage, as JSON) and `/kv_events/snapshot`
(the radix tree's leaf paths with the sequence number of the last event batch they include)."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vriksha.server.errors import ServerError
from vriksha.server.state import StateDep

router = APIRouter()


class KVEventsDisabledError(ServerError, status=404, type="invalid_request_error", code="kv_events_disabled"):
    """`/kv_events/snapshot` asked of a replica started without `--kv-events-endpoint`."""


@router.get("/load")
async def load(request: Request, state: StateDep) -> Response:
    s = state.engine.stats()
    total = max(1, s.kv_total_tokens)
    publisher = getattr(request.app.state, "kv_events", None)
    events = None if publisher is None else {"instance": publisher.instance, "seq": publisher.last_seq}
    return JSONResponse(
        {
            "kv_events": events,
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "server_waiting": state.admission.waiting,
            "in_flight": state.admission.in_flight,
            "kv_used_tokens": s.kv_used_tokens,
            "kv_cached_tokens": getattr(s, "kv_cached_tokens", 0),
            "kv_total_tokens": s.kv_total_tokens,
            "kv_usage": s.kv_used_tokens / total,
        }
    )


@router.get("/kv_events/snapshot")
async def kv_snapshot(request: Request, state: StateDep) -> Response:
    publisher = getattr(request.app.state, "kv_events", None)
    if publisher is None:
        raise KVEventsDisabledError(
            "this replica publishes no KV events; start it with `vriksha serve --kv-events-endpoint tcp://...`"
        )

    def leaf_paths(engine) -> list[list[int]]:
        tree = getattr(engine.cache, "tree", None)  # None: prefix caching is off, nothing is ever cached
        return tree.leaf_paths() if tree is not None else []

    def adapter_paths(engine) -> dict[str, list[list[int]]]:
        paths = getattr(engine.cache, "adapter_leaf_paths", None)
        return paths() if paths is not None else {}

    snap = await state.engine.call(
        lambda e: publisher.snapshot(lambda: leaf_paths(e), lambda: adapter_paths(e))
    )
    return Response(msgspec.json.encode(snap), media_type="application/json")
