"""`vriksha env serve NAME`: run an environment as a service (added to `vriksha env` by `envs/cli.py`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)


def _env_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def register_serve(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve an environment over WebSocket, HTTP, MCP and OpenEnv's wire format",
        description="Serve an environment: WebSocket sessions at /v1/ws (request ids, heartbeats), HTTP "
        "sessions at /v1/sessions, tools over MCP at /mcp, OpenEnv's protocol at /ws, /reset, /step; "
        "plus /health, /metadata and /schema. See docs/env_server.md.",
    )
    p.add_argument("name", help="environment name (see `vriksha env list`) or package.module:ClassName")
    from vriksha.envs.server import EnvServerConfig

    EnvServerConfig.add_arguments(p, exclude=EnvServerConfig.internal_fields(), title="environment server")
    p.add_argument("--no-mcp", action="store_true", help="do not serve the tools over MCP at /mcp")
    p.add_argument("--no-openenv", action="store_true", help="do not serve OpenEnv's wire format")
    p.add_argument(
        "--env-arg",
        action="append",
        type=_env_arg,
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the environment's constructor (VALUE parsed as JSON when it can be)",
    )
    from vriksha.net import FrontConfig, add_flags

    add_flags(p, FrontConfig, "HTTP front (connection limits)")
    p.set_defaults(func=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> int:
    from vriksha.envs.server import EnvServerConfig, resolve_env_class, serve
    from vriksha.net import FrontConfig, from_args

    given = EnvServerConfig.from_args(args)
    for name, value, low in (
        ("--max-sessions", given.max_sessions, 1),
        ("--idle-timeout", given.idle_timeout_s, 1e-3),
        ("--heartbeat", given.heartbeat_s, 1e-3),
        ("--detach-grace", given.detach_grace_s, 0),
    ):
        if value < low:
            raise ConfigError(f"{name} must be at least {low}, got {value}")
    if not 0 <= given.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {given.port}")
    front = from_args(FrontConfig, args)
    front.validate()
    env_cls = resolve_env_class(args.name)
    config = given.replace(
        mcp=not args.no_mcp, openenv=not args.no_openenv, env_kwargs=dict(args.env_arg), front=front
    )
    try:  # fail now, with the constructor's message, on a bad --env-arg
        env_cls(**config.env_kwargs).close()
    except TypeError as exc:
        raise ConfigError(f"{env_cls.name}: {exc}; check --env-arg") from None
    print(
        f"serving {env_cls.name!r} on http://{config.host}:{config.port} "
        f"(WebSocket /v1/ws, HTTP /v1/sessions{', MCP /mcp' if config.mcp else ''}"
        f"{', OpenEnv /ws' if config.openenv else ''}; max {config.max_sessions} sessions)",
        file=sys.stderr,
        flush=True,
    )
    serve(env_cls, config, log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower())
    return 0
