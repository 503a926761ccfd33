"""A replica's part in prefill/decode disaggregation (`vriksha serve --role`): its options, the transfer sides
it runs, and the HTTP peer through which a decode replica asks a prefill replica to compute a prompt.

- `both` (default): colocated serving, no transfer endpoints.
- `prefill`: computes prompts it is sent on `POST /kv/prefill` and offers their K/V (over shared memory to
  a decode replica on this host, over its ZMQ stream socket to one elsewhere) until `POST /kv/release` or
  the hold timeout.
- `decode`: on `POST /kv/pull` fetches what of a prompt it lacks from a prefill replica into its radix tree,
  so the request the router sends next only decodes.

Both roles need the internal key: the `/kv/*` endpoints take it (never a client's API key), a decode replica
presents it to the prefill replica and asks only the prefill replicas it was given (`--kv-peer`), and the
stream transport's socket is CURVE-keyed by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

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
from vriksha.net.curve import CurveKeys
from vriksha.net.trust import INTERNAL_KEY_ENV, internal_headers

logger = logging.getLogger(__name__)

ROLES = ("both", "prefill", "decode")


@dataclass(slots=True)
class KVRoleConfig:
    role: str = "both"
    transport: str = "auto"  # auto: shared memory to a replica on this host, the stream to others
    endpoint: str = "tcp://127.0.0.1:*"  # the stream transport's socket on a prefill replica
    timeout_s: float = 10.0  # a decode replica's bound on one fetch
    hold_s: float = 30.0  # a prefill replica's bound on an offer nobody fetches
    prefill_timeout_s: float = 10.0  # a decode replica's bound on the prefill replica's answer
    peers: list[str] = field(default_factory=list)  # the prefill replicas a decode replica may ask
    internal_key: str | None = None  # presented to the prefill replica; keys the stream socket's CURVE

    def validate(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"--role must be one of {ROLES}, got {self.role!r}")
        if self.role != "both" and not self.internal_key:
            raise ConfigError(
                f"--role {self.role} needs --internal-key (or ${INTERNAL_KEY_ENV}), the same on the router and "
                "every prefill and decode replica: the /kv/* endpoints and the K/V stream take it, never a "
                "client's API key (`vriksha fleet` makes one for its members)"
            )
        if self.peers and self.role != "decode":
            raise ConfigError(
                "--kv-peer names the prefill replicas a decode replica may ask: use it with --role decode"
            )
        for url in self.peers:
            peer_origin(url)
        if self.transport != "auto" and self.transport not in TRANSPORTS:
            raise ConfigError(
                f"--kv-transport must be auto or one of {sorted(TRANSPORTS)}, got {self.transport!r}"
            )
        bounds = (
            ("--kv-transfer-timeout", self.timeout_s),
            ("--kv-transfer-hold", self.hold_s),
            ("--kv-prefill-timeout", self.prefill_timeout_s),
        )
        for name, value in bounds:
            if not value > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {value}")

    @property
    def transports(self) -> list[str]:
        return accepted(self.transport)

    def allowed_peer(self, url: str) -> str | None:
        """The configured peer `url` names (the same scheme, host and port), or None."""
        try:
            origin = peer_origin(url)
        except ConfigError:
            return None
        return next((p.rstrip("/") for p in self.peers if peer_origin(p) == origin), None)


def peer_origin(url: str) -> str:
    """`scheme://host:port` of a replica's base URL; anything else in it (a path, a user) is refused."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or port == -1
    ):
        raise ConfigError(f"{url!r} is not a replica's base URL (http[s]://HOST[:PORT])")
    port = port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname.lower()
    return f"{parts.scheme}://[{host}]:{port}" if ":" in host else f"{parts.scheme}://{host}:{port}"


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
        help=f"decode: seconds one fetch may take before its slots are freed (default: {d.timeout_s:g})",
    )
    g.add_argument(
        "--kv-prefill-timeout",
        type=float,
        default=d.prefill_timeout_s,
        help="decode: seconds a prefill replica may take to compute a prompt and offer its K/V; past it the "
        "transfer fails and the request is computed here (raise it for long prompts on slow prefill "
        f"replicas; default: {d.prefill_timeout_s:g})",
    )
    g.add_argument(
        "--kv-peer",
        action="append",
        default=[],
        metavar="URL",
        help="decode: a prefill replica this replica may ask (its base URL); a /kv/pull naming any other is "
        "refused; repeat per prefill replica (default: none)",
    )
    g.add_argument(
        "--kv-transfer-hold",
        type=float,
        default=d.hold_s,
        help="prefill: seconds an offer waits for its decode replica before it is freed (default: 30)",
    )


def from_args(args: Any, internal_key: str | None) -> KVRoleConfig:
    config = KVRoleConfig(
        role=args.role,
        transport=args.kv_transport,
        endpoint=args.kv_transfer_endpoint,
        timeout_s=args.kv_transfer_timeout,
        hold_s=args.kv_transfer_hold,
        prefill_timeout_s=args.kv_prefill_timeout,
        peers=list(args.kv_peer),
        internal_key=internal_key,
    )
    config.validate()
    return config


class HttpPeer:
    """The prefill replica at `url`, as the decode side's `PrefillPeer`."""

    def __init__(self, url: str, http: httpx.AsyncClient, config: KVRoleConfig) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.config = config
        self.headers = internal_headers(config.internal_key)

    async def prefill(self, tokens: list[int], start: int) -> Descriptor:
        body = {
            "token_ids": tokens,
            "start": start,
            "transports": self.config.transports,
            "host_id": host_id(),
        }
        bound = self.config.prefill_timeout_s
        try:
            async with asyncio.timeout(bound):  # the whole exchange, not each read
                resp = await self.http.post(f"{self.url}/kv/prefill", json=body, headers=self.headers)
        except TimeoutError:
            raise KVTransferError(
                f"the prefill replica {self.url} did not offer the prompt within {bound:g} s "
                "(--kv-prefill-timeout); it is stuck or slow, so the prompt is computed here"
            ) from None
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
        keys = CurveKeys.from_key(config.internal_key) if config.internal_key else None
        if config.role == "prefill":
            sources = {}
            for name in config.transports:
                source_cls, _ = TRANSPORTS[name]
                sources[name] = source_cls(endpoint=config.endpoint, secure=keys.serve if keys else None)
            self.prefill = PrefillSide(engine.call, pool, sources, config.hold_s)
        elif config.role == "decode":
            sinks = {
                name: TRANSPORTS[name][1](secure=keys.connect if keys else None) for name in config.transports
            }
            self.decode = DecodeSide(engine.call, pool, sinks, config.timeout_s)
            if not config.peers:
                logger.warning(
                    "--role decode without --kv-peer: every /kv/pull naming a prefill_url is refused"
                )

    def peer(self, url: str) -> HttpPeer | None:
        """The prefill replica `url` names, if it is one of `--kv-peer`; None otherwise."""
        allowed = self.config.allowed_peer(url)
        if allowed is None:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.config.prefill_timeout_s, connect=5.0))
        return HttpPeer(allowed, self._http, self.config)

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
