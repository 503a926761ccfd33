"""`vriksha router`: an OpenAI-compatible front over vriksha replicas."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

from vriksha.errors import ConfigError
from vriksha.net.trust import INTERNAL_KEY_ENV, check_keys, env_key
from vriksha.router.config import POLICIES, ReplicaSpec, RouterConfig

logger = logging.getLogger(__name__)
_D = RouterConfig()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "router",
        help="route OpenAI requests over vriksha replicas (prefix-cache and load aware)",
        description="An OpenAI-compatible router over `vriksha serve` replicas: /v1/completions, "
        "/v1/chat/completions, /v1/models, /generate, /health, /metrics. See docs/router.md.",
    )
    p.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="URL[,EVENTS]",
        help="a replica's base URL, optionally with its --kv-events-endpoint after a comma "
        "(e.g. http://127.0.0.1:8001,tcp://127.0.0.1:5557); repeat per replica",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="ROUTES.yaml",
        help="route between model pools by what each request asks (signals, decisions, a semantic cache); "
        "the pools' replicas come from the file, not --replica. See docs/semantic_router.md",
    )
    p.add_argument(
        "--prefill",
        action="append",
        default=[],
        metavar="URL",
        help="a prefill replica (`vriksha serve --role prefill`): long prompts are computed there and their K/V "
        "moved to the decode replica (--replica, started with --role decode) before it decodes; repeatable",
    )
    p.add_argument(
        "--pd-threshold",
        type=int,
        default=_D.pd_threshold_tokens,
        help="with --prefill: a prompt goes through a prefill replica when more than this many of its tokens "
        f"are not cached on the chosen decode replica (default: {_D.pd_threshold_tokens})",
    )
    p.add_argument(
        "--pd-timeout",
        type=float,
        default=_D.pd_timeout_s,
        help="with --prefill: seconds a whole transfer (the decode replica's /kv/pull) may take; past it the "
        f"request goes to the decode replica as is (default: {_D.pd_timeout_s:g})",
    )
    p.add_argument(
        "--policy", choices=POLICIES, default=_D.policy, help=f"routing policy (default: {_D.policy})"
    )
    p.add_argument(
        "--model", default=None, help="the replicas' model, for the tokenizer (default: the embedded one)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (default: 8080)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("VRIKSHA_API_KEY"),
        help="require `Authorization: Bearer KEY` (default: $VRIKSHA_API_KEY, else none); it is passed on to "
        "the replicas unchanged, and presented on the router's own /load and /health polls",
    )
    p.add_argument(
        "--internal-key",
        default=None,
        help="the replicas' --internal-key: presented on /load, /kv_events/snapshot and /kv/pull, and the CURVE "
        "keys of their event streams; needed with event streams (URL,EVENTS) and --prefill (default: "
        "$VRIKSHA_INTERNAL_KEY; prefer the variable: a flag shows in the process list)",
    )
    p.add_argument(
        "--session-header",
        default=_D.session_header,
        help=f"requests with the same value of this header go to the same replica (default: {_D.session_header})",
    )
    p.add_argument(
        "--health-interval", type=float, default=_D.health_interval_s, help="seconds between /health checks"
    )
    p.add_argument(
        "--load-interval", type=float, default=_D.load_interval_s, help="seconds between /load polls"
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=_D.request_timeout_s,
        help="seconds a replica may take per read",
    )
    from vriksha.net import FrontConfig, add_flags

    add_flags(p, FrontConfig, "HTTP front (connection limits)")
    g = p.add_argument_group("cache_aware")
    g.add_argument(
        "--cache-threshold", type=float, default=_D.cache_threshold, help="match rate to follow a prefix"
    )
    g.add_argument(
        "--balance-abs-threshold", type=int, default=_D.balance_abs_threshold, help="load gap (requests)"
    )
    g.add_argument("--balance-rel-threshold", type=float, default=_D.balance_rel_threshold, help="load ratio")
    g = p.add_argument_group("precise")
    g.add_argument(
        "--queue-cost", type=float, default=_D.queue_cost_tokens, help="token-equivalents per queued request"
    )
    g.add_argument(
        "--kv-cost", type=float, default=_D.kv_cost_tokens, help="token-equivalents at a full KV pool"
    )
    g.add_argument(
        "--affinity-bound",
        type=float,
        default=_D.affinity_bound_tokens,
        help="keep the replica holding the prefix unless its estimate is worse by more than this (tokens)",
    )
    g.add_argument(
        "--affinity-min-share",
        type=float,
        default=_D.affinity_min_share,
        help="the affinity rule binds only a replica holding at least this share of the prompt (0..1) more "
        "than the replica with the best estimate",
    )
    p.set_defaults(func=handler, default_log_level="INFO")  # its address, replicas and policy, and "ready"


def config_from_args(args: argparse.Namespace, need_replicas: bool = True) -> RouterConfig:
    if args.replica and not need_replicas:
        raise ConfigError("with --config the replicas are listed per pool in the routes file: drop --replica")
    if args.prefill and not need_replicas:
        raise ConfigError(
            "--prefill works with --replica pools only, not with --config yet: drop one of them"
        )
    if not args.replica and need_replicas:
        raise ConfigError("give at least one --replica URL (the base URL of a `vriksha serve`)")
    specs = []
    for item in args.replica:
        url, _, events = item.partition(",")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--replica {item!r}: the URL must start with http:// or https://")
        if events and not events.startswith(("tcp://", "ipc://")):
            raise ConfigError(
                f"--replica {item!r}: the events endpoint must be tcp://HOST:PORT or ipc://PATH"
            )
        specs.append(ReplicaSpec(url.rstrip("/"), events or None, "decode" if args.prefill else "both"))
    for url in args.prefill:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--prefill {url!r}: the URL must start with http:// or https://")
        specs.append(ReplicaSpec(url.rstrip("/"), None, "prefill"))
    if args.pd_threshold < 0:
        raise ConfigError(f"--pd-threshold must be >= 0 tokens, got {args.pd_threshold}")
    if not 0.0 <= args.affinity_min_share <= 1.0:
        raise ConfigError(
            f"--affinity-min-share must be in 0..1 (a share of the prompt), got {args.affinity_min_share}"
        )
    if not args.pd_timeout > 0:
        raise ConfigError(f"--pd-timeout must be > 0 seconds, got {args.pd_timeout}")
    internal_key = args.internal_key or env_key(INTERNAL_KEY_ENV)
    check_keys(args.api_key or None, internal_key)
    if not internal_key and (args.prefill or any(s.events for s in specs)):
        raise ConfigError(
            "event streams (--replica URL,EVENTS) and --prefill need the replicas' internal key: pass "
            f"--internal-key or set ${INTERNAL_KEY_ENV} to the key the replicas were started with"
        )
    if need_replicas and args.policy == "precise" and not any(s.events for s in specs):
        logger.warning(
            "--policy precise without event streams: it sees load only (add ,tcp://... to --replica)"
        )
    return RouterConfig(
        replicas=specs,
        policy=args.policy,
        model=args.model,
        api_key=args.api_key or None,
        internal_key=internal_key,
        session_header=args.session_header.lower(),
        health_interval_s=args.health_interval,
        load_interval_s=args.load_interval,
        request_timeout_s=args.request_timeout,
        cache_threshold=args.cache_threshold,
        balance_abs_threshold=args.balance_abs_threshold,
        balance_rel_threshold=args.balance_rel_threshold,
        queue_cost_tokens=args.queue_cost,
        kv_cost_tokens=args.kv_cost,
        affinity_bound_tokens=args.affinity_bound,
        affinity_min_share=args.affinity_min_share,
        pd_threshold_tokens=args.pd_threshold,
        pd_timeout_s=args.pd_timeout,
    )


def handler(args: argparse.Namespace) -> int:
    from vriksha.net import FrontConfig, from_args, front_config
    from vriksha.router.app import create_router_app

    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    front = from_args(FrontConfig, args)
    front.validate()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per forwarded request otherwise
    if args.config:
        from vriksha.semantic.serve import semantic_app

        app = semantic_app(args.config, config_from_args(args, need_replicas=False))
        ready = f"routing by meaning ({args.config})"
    else:
        config = config_from_args(args)
        app = create_router_app(config)
        ready = f"routing to {', '.join(r.url for r in config.replicas)}"
    level = logging.getLogger().getEffectiveLevel()
    uv_config = front_config(
        app,
        args.host,
        args.port,
        front,
        log_level=max(level, logging.INFO) if level <= logging.INFO else level,
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    server = _server_class()(uv_config, front, ready)
    try:
        server.run()
    finally:
        close = getattr(app.state, "close", None)  # the routes file's fleet pools
        if close is not None:
            close()
    if not server.started:
        raise ConfigError(
            f"the router did not start on {args.host}:{args.port}; is the port in use? pick another --port"
        )
    return 0


def _server_class():
    from vriksha.net import FrontServer

    class RouterServer(FrontServer):
        """Exits 0 after a SIGTERM/SIGINT shutdown (uvicorn re-raises the signal: status 143)."""

        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGINT and self.should_exit:
                self.force_exit = True
            self.should_exit = True

    return RouterServer
