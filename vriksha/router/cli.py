"""`vriksha router`: an OpenAI-compatible front over vriksha replicas."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

from vriksha.errors import ConfigError
from vriksha.net.trust import INTERNAL_KEY_ENV, check_keys, env_key
from vriksha.router.config import ReplicaSpec, RouterConfig

logger = logging.getLogger(__name__)


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
    from vriksha.net import FrontConfig, add_flags

    add_flags(p, FrontConfig, "HTTP front (connection limits)")
    groups = RouterConfig.flag_groups()
    grouped = {name for names in groups.values() for name in names}
    RouterConfig.add_arguments(p, exclude=(*RouterConfig.internal_fields(), *grouped), title="router")
    for title, names in groups.items():
        others = [n for n in RouterConfig.option_names() if n not in names]
        RouterConfig.add_arguments(p, exclude=others, title=title)
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
    config = RouterConfig.from_args(args)
    if config.pd_threshold_tokens < 0:
        raise ConfigError(f"--pd-threshold must be >= 0 tokens, got {config.pd_threshold_tokens}")
    if not 0.0 <= config.affinity_min_share <= 1.0:
        raise ConfigError(
            f"--affinity-min-share must be in 0..1 (a share of the prompt), got {config.affinity_min_share}"
        )
    if not config.pd_timeout_s > 0:
        raise ConfigError(f"--pd-timeout must be > 0 seconds, got {config.pd_timeout_s}")
    given = RouterConfig.given_args(args)
    api_key = (given["api_key"] if "api_key" in given else os.environ.get("VRIKSHA_API_KEY")) or None
    internal_key = config.internal_key or env_key(INTERNAL_KEY_ENV)
    check_keys(api_key, internal_key)
    if not internal_key and (args.prefill or any(s.events for s in specs)):
        raise ConfigError(
            "event streams (--replica URL,EVENTS) and --prefill need the replicas' internal key: pass "
            f"--internal-key or set ${INTERNAL_KEY_ENV} to the key the replicas were started with"
        )
    if need_replicas and config.policy == "precise" and not any(s.events for s in specs):
        logger.warning(
            "--policy precise without event streams: it sees load only (add ,tcp://... to --replica)"
        )
    return config.replace(
        replicas=specs,
        api_key=api_key,
        internal_key=internal_key,
        session_header=config.session_header.lower(),
    )


def handler(args: argparse.Namespace) -> int:
    from vriksha.net import FrontConfig, from_args, front_config
    from vriksha.router.app import create_router_app

    host, port = (bound := RouterConfig.from_args(args)).host, bound.port
    if not 0 <= port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {port}")
    front = from_args(FrontConfig, args)
    front.validate()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per forwarded request otherwise
    if args.config:
        from vriksha.router.semantic.serve import semantic_app

        app = semantic_app(args.config, config_from_args(args, need_replicas=False))
        ready = f"routing by meaning ({args.config})"
    else:
        config = config_from_args(args)
        app = create_router_app(config)
        ready = f"routing to {', '.join(r.url for r in config.replicas)}"
    level = logging.getLogger().getEffectiveLevel()
    uv_config = front_config(
        app,
        host,
        port,
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
            f"the router did not start on {host}:{port}; is the port in use? pick another --port"
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
