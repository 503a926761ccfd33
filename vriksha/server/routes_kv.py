"""The endpoints of prefill/decode disaggregation (present on replicas started with `--role prefill|decode`):

- `POST /kv/prefill` (prefill): compute a prompt given in token ids and offer its K/V past `start`; answers
  the transfer descriptor.
- `POST /kv/release` (prefill): the decode replica is done with an offer.
- `POST /kv/pull` (decode): bring a prompt's K/V into this replica's radix tree from a prefill replica
  (`prefill_url`) or from an `offer` already made; answers what was cached and what was fetched.
- `GET /kv/transfers`: both sides' counters and what they hold now (offers, reservations).

A failed transfer (`KVTransferError`) answers 502 `kv_transfer_failed`, through the server's error mapping.
Every endpoint here takes the internal key only (server/auth.py); a `prefill_url` must be one of the decode
replica's `--kv-peer`s (403 otherwise).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from vriksha.engine.kv_transfer import Descriptor
from vriksha.engine.sampling_params import SamplingParams
from vriksha.net.fields import TokenId
from vriksha.server.context import check_context
from vriksha.server.errors import ServerError, TransferFailedError, WrongRoleError
from vriksha.server.kv_roles import KVRoles
from vriksha.server.protocol import Strict
from vriksha.server.state import StateDep

router = APIRouter(prefix="/kv")


class PeerNotAllowedError(ServerError, status=403, type="invalid_request_error", code="peer_not_allowed"):
    """A /kv/pull naming a prefill replica outside the decode replica's `--kv-peer` list."""


class PrefillRequest(Strict):
    token_ids: list[TokenId] = Field(min_length=1)
    start: int = Field(0, ge=0)
    transports: list[str] = Field(default_factory=lambda: ["stream"], min_length=1)
    host_id: str = ""
    hold_s: float | None = Field(None, gt=0)


class ReleaseRequest(Strict):
    transfer_id: str


class PullRequest(Strict):
    token_ids: list[TokenId] = Field(min_length=1)
    prefill_url: str | None = None
    offer: dict[str, Any] | None = None
    min_new_tokens: int = Field(0, ge=0)


def _roles(request: Request, side: str) -> Any:
    roles: KVRoles | None = getattr(request.app.state, "kv_roles", None)
    found = None if roles is None else getattr(roles, side)
    if found is None:
        role = "both" if roles is None else roles.config.role
        raise WrongRoleError(
            f"this replica runs --role {role}; /kv/{'prefill' if side == 'prefill' else 'pull'} needs a replica "
            f"started with --role {side}"
        )
    return roles, found


@router.post("/prefill")
async def prefill(req: PrefillRequest, request: Request, state: StateDep) -> Response:
    roles, side = _roles(request, "prefill")
    params = SamplingParams(max_tokens=1, temperature=0.0)
    check_context(len(req.token_ids), params, int(state.max_model_len))
    if req.start >= len(req.token_ids):
        raise TransferFailedError(f"start {req.start} is past the prompt's {len(req.token_ids)} tokens")
    stream = state.client.open(list(req.token_ids), params, "kv_prefill")
    await stream.final()
    desc = await side.offer(list(req.token_ids), req.start, req.transports, req.host_id, req.hold_s)
    roles.watch_offers()
    return JSONResponse(desc.to_dict())


@router.post("/release")
async def release(req: ReleaseRequest, request: Request) -> Response:
    _, side = _roles(request, "prefill")
    return JSONResponse({"released": await side.release(req.transfer_id)})


@router.post("/pull")
async def pull(req: PullRequest, request: Request, state: StateDep) -> Response:
    roles, side = _roles(request, "decode")
    if (req.prefill_url is None) == (req.offer is None):
        raise TransferFailedError(
            "give exactly one of prefill_url (a prefill replica) or offer (a descriptor)"
        )
    tokens = list(req.token_ids)
    check_context(len(tokens), SamplingParams(max_tokens=1), int(state.max_model_len))
    if req.prefill_url is not None:
        peer = roles.peer(req.prefill_url)
        if peer is None:
            raise PeerNotAllowedError(
                f"prefill_url {req.prefill_url!r} is not a prefill replica this decode replica may ask; start it "
                "with --kv-peer URL for each of its prefill replicas",
                param="prefill_url",
            )
        result = await side.pull(tokens, peer=peer, min_new=req.min_new_tokens)
    else:
        result = await side.pull(tokens, offer=Descriptor.from_dict(req.offer), min_new=req.min_new_tokens)
    return JSONResponse(
        {
            "cached": result.cached,
            "fetched": result.fetched,
            "transport": result.transport,
            "skipped": result.skipped,
        }
    )


@router.get("/transfers")
async def transfers(request: Request, state: StateDep) -> Response:
    roles: KVRoles | None = getattr(request.app.state, "kv_roles", None)
    body = {"role": "both"} if roles is None else roles.status()

    def pool(engine: Any) -> dict[str, int]:
        tree = getattr(engine.cache, "tree", None)
        return {
            "free_slots": engine.allocator.num_free,
            "capacity": engine.allocator.capacity,
            "cached_tokens": engine.cache.total_size(),
            "locked_tokens": 0 if tree is None else tree.protected_size(),
            "running": len(engine.scheduler.running) + len(engine.scheduler.waiting),
        }

    body["pool"] = await state.engine.call(pool)
    return JSONResponse(body)
