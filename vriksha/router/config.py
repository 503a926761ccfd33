"""The router's options: one config class that also declares `vriksha router`'s flags (`vriksha.options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from vriksha.options import Options, option

POLICIES = ("round_robin", "least_load", "cache_aware", "precise")


@dataclass(slots=True)
class ReplicaSpec:
    url: str
    events: str | None = None  # ZMQ endpoint of its token-granular KV events
    role: str = "both"  # both | decode: takes requests; prefill: computes long prompts for the others


@dataclass(slots=True)
class RouterConfig(Options):
    """The router's options; those declared with `option()` are also `vriksha router`'s flags."""

    options_label: ClassVar[str] = "router"
    flag_dest_prefix: ClassVar[str] = "router_"

    replicas: list[ReplicaSpec] = field(default_factory=list)
    policy: str = option("precise", "routing policy", choices=POLICIES)
    model: str | None = option(None, "the replicas' model, for the tokenizer (default: the embedded one)")
    host: str = option("127.0.0.1", "address to bind")
    port: int = option(8080, "port to bind")
    api_key: str | None = option(
        None,
        "require `Authorization: Bearer KEY` (default: $VRIKSHA_API_KEY, else none); it is passed on to the "
        "replicas unchanged, and presented on the router's own /load and /health polls",
    )
    internal_key: str | None = option(
        None,
        "the replicas' --internal-key: presented on /load, /kv_events/snapshot and /kv/pull, and the CURVE keys "
        "of their event streams; needed with event streams (URL,EVENTS) and --prefill (default: "
        "$VRIKSHA_INTERNAL_KEY; prefer the variable: a flag shows in the process list); never forwarded from "
        "or to a client",
    )
    auth_exempt: frozenset[str] = frozenset({"/health", "/metrics"})
    session_header: str = option(
        "x-session-id", "requests with the same value of this header go to the same replica"
    )
    max_sessions: int = 100_000
    health_interval_s: float = option(1.0, "seconds between /health checks", flag="health-interval")
    load_interval_s: float = option(0.25, "seconds between /load polls", flag="load-interval")
    connect_timeout_s: float = 2.0
    request_timeout_s: float = option(600.0, "seconds a replica may take per read", flag="request-timeout")
    # cache_aware (SGLang's router): approximate trees of routed prompts
    cache_threshold: float = option(0.3, "match rate to follow a prefix")
    balance_abs_threshold: int = option(32, "load gap (requests)")
    balance_rel_threshold: float = option(1.5, "load ratio")
    max_tree_tokens: int = 1 << 22
    # precise: estimated time to first token in token-equivalents of prefill
    queue_cost_tokens: float = option(64.0, "token-equivalents per queued request", flag="queue-cost")
    kv_cost_tokens: float = option(256.0, "token-equivalents at a full KV pool", flag="kv-cost")
    affinity_bound_tokens: float = option(
        512.0,
        "keep the replica holding the prefix unless its estimate is worse by more than this (tokens)",
        flag="affinity-bound",
    )
    affinity_min_share: float = option(
        0.3,
        "the affinity rule binds only a replica holding at least this share of the prompt (0..1) more than the "
        "replica with the best estimate",
    )
    pending_ttl_s: float = 30.0  # routed prompts count as cached there until events confirm them
    pd_threshold_tokens: int = option(
        256,
        "with --prefill: a prompt goes through a prefill replica when more than this many of its tokens are not "
        "cached on the chosen decode replica",
        flag="pd-threshold",
    )
    pd_timeout_s: float = option(
        30.0,
        "with --prefill: seconds a whole transfer (the decode replica's /kv/pull) may take; past it the request "
        "goes to the decode replica as is",
        flag="pd-timeout",
    )

    @classmethod
    def flag_groups(cls) -> dict[str, tuple[str, ...]]:
        """The options each policy alone reads, shown in a group of their own in `--help`."""
        return {
            "cache_aware": ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold"),
            "precise": ("queue_cost_tokens", "kv_cost_tokens", "affinity_bound_tokens", "affinity_min_share"),
        }

    @classmethod
    def internal_fields(cls) -> tuple[str, ...]:
        """Fields that are not command-line options (set by code, or by the routes file)."""
        return tuple(f.name for f in dataclasses.fields(cls) if "help" not in f.metadata)
