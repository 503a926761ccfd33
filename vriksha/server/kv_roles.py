"""A replica's part in prefill/decode disaggregation (`vriksha serve --role`): its options, the transfer sides
it runs, and the HTTP peer through which a decode replica asks a prefill replica to compute a prompt.

- `both` (default): colocated serving, no transfer endpoints.
- `prefill`: computes prompts it is sent on `POST /kv/prefill` and offers their K/V (over shared memory to
  a decode replica on this host, over its ZMQ stream socket to one elsewhere) until `POST /kv/release` or
  the hold timeout.
- `decode`: on `POST /kv/pull` fetches what of a prompt it lacks from a prefill replica into its radix tree,
  so the request the router sends next only decodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from vriksha.engine.kv_transfer import (
    TRANSPORTS,
    DecodeSide,
    Descriptor,
    KVTransferError,
    PrefillSide,
    accepted,
    host_id,
)
from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

ROLES = ("both", "prefill", "decode")


@dataclass(slots=True)
class KVRoleConfig:
    role: str = "both"
    transport: str = "auto"  # auto: shared memory to a replica on this host, the stream to others
    endpoint: str = "tcp://127.0.0.1:*"  # the stream transport's socket on a prefill replica
    timeout_s: float = 30.0  # a decode replica's bound on one fetch
    hold_s: float = 30.0  # a prefill replica's bound on an offer nobody fetches
    prefill_timeout_s: float = 600.0  # a decode replica's bound on the prefill replica's answer
    api_key: str | None = None  # sent to the prefill replica

    def validate(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"--role must be one of {ROLES}, got {self.role!r}")
        if self.transport != "auto" and self.transport not in TRANSPORTS:
            raise ConfigError(
                f"--kv-transport must be auto or one of {sorted(TRANSPORTS)}, got {self.transport!r}"
            )
        for name, value in (("--kv-transfer-timeout", self.timeout_s), ("--kv-transfer-hold", self.hold_s)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {value}")

    @property
    def transports(self) -> list[str]:
        return accepted(self.transport)


def add_arguments(p: Any) -> None:
    d = KVRoleConfig()
    g = p.add_argument_group("prefill/decode disaggregation (see docs/router.md)")
    g.add_argument(
        "--role",
        choices=ROLES,
        default=d.role,
        help="both: colocated serving; prefill: compute prompts for decode replicas and offer their K/V; "
        "decode: fetch prompts' K/V from prefill replicas, then decode (default: both)",
    )
    g.add_argument(
        "--kv-transport",
        default=d.transport,
        choices=["auto", *sorted(TRANSPORTS)],
        help="how K/V moves: auto (shared memory between replicas on one host, the stream otherwise), shm, "
        "stream (default: auto)",
    )
    g.add_argument(
        "--kv-transfer-endpoint",
        default=d.endpoint,
        metavar="ZMQ_ENDPOINT",
        help="a prefill replica's stream socket (tcp://0.0.0.0:PORT to serve decode replicas on other hosts; "
        "default: tcp://127.0.0.1:* , a free port)",
    )
    g.add_argument(
        "--kv-transfer-timeout",
        type=float,
        default=d.timeout_s,
        help="decode: seconds one fetch may take before its slots are freed (default: 30)",
    )
    g.add_argument(
        "--kv-transfer-hold",
        type=float,
        default=d.hold_s,
        help="prefill: seconds an offer waits for its decode replica before it is freed (default: 30)",
    )


def from_args(args: Any) -> KVRoleConfig:
    config = KVRoleConfig(
        role=args.role,
        transport=args.kv_transport,
        endpoint=args.kv_transfer_endpoint,
        timeout_s=args.kv_transfer_timeout,
        hold_s=args.kv_transfer_hold,
        api_key=getattr(args, "api_key", None) or None,
    )
    config.validate()
    return config


class HttpPeer:
    """The prefill replica at `url`, as the decode side's `PrefillPeer`."""

    def __init__(self, url: str, http: httpx.AsyncClient, config: KVRoleConfig) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.config = config
        self.headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    async def prefill(self, tokens: list[int], start: int) -> Descriptor:
        body = {
            "token_ids": tokens,
            "start": start,
            "transports": self.config.transports,
            "host_id": host_id(),
        }
        try:
            resp = await self.http.post(
                f"{self.url}/kv/prefill",
                json=body,
                headers=self.headers,
                timeout=self.config.prefill_timeout_s,
            )
        except httpx.HTTPError as exc:
            raise KVTransferError(
                f"the prefill replica {self.url} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if resp.status_code != 200:
            raise KVTransferError(
                f"the prefill replica {self.url} answered {resp.status_code}: {resp.text[:300]}"
            )
        return Descriptor.from_dict(resp.json())

    async def release(self, desc: Descriptor) -> None:
        await self.http.post(
            f"{self.url}/kv/release", json={"transfer_id": desc.transfer_id}, headers=self.headers, timeout=10
        )


class KVRoles:
    """The transfer sides a replica runs for its role, built around its `AsyncEngine`."""

    def __init__(self, engine: Any, config: KVRoleConfig) -> None:
        self.config = config
        self.prefill: PrefillSide | None = None
        self.decode: DecodeSide | None = None
        self._http: httpx.AsyncClient | None = None
        self._sweeper: asyncio.Task | None = None
        pool = engine.engine.pool
        if config.role == "prefill":
            sources = {}
            for name in config.transports:
                source_cls, _ = TRANSPORTS[name]
                sources[name] = source_cls(endpoint=config.endpoint)
            self.prefill = PrefillSide(engine.call, pool, sources, config.hold_s)
        elif config.role == "decode":
            sinks = {name: TRANSPORTS[name][1]() for name in config.transports}
            self.decode = DecodeSide(engine.call, pool, sinks, config.timeout_s)

    def peer(self, url: str) -> HttpPeer:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.config.prefill_timeout_s, connect=5.0))
        return HttpPeer(url, self._http, self.config)

    def watch_offers(self) -> None:
        """Sweep expired offers while there are any (started by each new offer)."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="vriksha-kv-offers")

    async def _sweep(self) -> None:
        assert self.prefill is not None
        step = min(0.5, self.config.hold_s / 4)
        while self.prefill.offers:
            await asyncio.sleep(step)
            try:
                await self.prefill.sweep()
            except Exception:  # noqa: BLE001 - the next sweep tries again
                logger.exception("sweeping K/V offers failed")

    def status(self) -> dict[str, Any]:
        return {
            "role": self.config.role,
            "prefill": None if self.prefill is None else self.prefill.status(),
            "decode": None if self.decode is None else self.decode.status(),
        }

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        if self.prefill is not None:
            await self.prefill.close()
        if self.decode is not None:
            await self.decode.close()
        if self._http is not None:
            await self._http.aclose()
