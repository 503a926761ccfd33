"""The router's options; `vriksha router` builds its flags from these defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("round_robin", "least_load", "cache_aware", "precise")


@dataclass(slots=True)
class ReplicaSpec:
    url: str
    events: str | None = None  # ZMQ endpoint of its token-granular KV events
    role: str = "both"  # both | decode: takes requests; prefill: computes long prompts for the others


@dataclass(slots=True)
class RouterConfig:
    replicas: list[ReplicaSpec] = field(default_factory=list)
    policy: str = "precise"
    model: str | None = None  # for the tokenizer; None: the embedded default
    api_key: str | None = None  # clients' key; also presented on the router's own polls of /load and /health
    # the replicas' internal key: presented on /load, /kv_events/snapshot and /kv/pull, and the CURVE keys of
    # the event streams; never forwarded from or to a client
    internal_key: str | None = None
    auth_exempt: frozenset[str] = frozenset({"/health", "/metrics"})
    session_header: str = "x-session-id"
    max_sessions: int = 100_000
    health_interval_s: float = 1.0
    load_interval_s: float = 0.25
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 600.0
    # cache_aware (SGLang's router): approximate trees of routed prompts
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    max_tree_tokens: int = 1 << 22
    # precise: estimated time to first token in token-equivalents of prefill
    queue_cost_tokens: float = 64.0  # per request a replica is already serving
    kv_cost_tokens: float = 256.0  # times the replica's KV usage (0..1)
    affinity_bound_tokens: float = 512.0  # keep the prefix holder unless it is worse than this
    affinity_min_share: float = 0.3  # ... when it holds at least this share of the prompt more than the best
    pending_ttl_s: float = 30.0  # routed prompts count as cached there until events confirm them
    # prefill/decode: a prompt whose uncached part on the chosen replica is longer than this many tokens is
    # computed on a prefill replica (when there is one) and its K/V moved over first
    pd_threshold_tokens: int = 256
    # the router's bound on a whole transfer (the decode replica's /kv/pull: its prefill and fetch timeouts);
    # past it the request goes to the decode replica as is and is computed there
    pd_timeout_s: float = 30.0
