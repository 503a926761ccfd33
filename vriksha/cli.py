"""The `vriksha` command. Each subcommand lives in its package's `cli.py` and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from vriksha.errors import VrikshaError

# subcommand -> module with `register(subparsers)`; each module adds its parser and sets `func`.
SUBCOMMANDS: dict[str, str] = {
    "generate": "vriksha.engine.cli",
    "tune": "vriksha.engine.tune",
    "serve": "vriksha.server.cli",
    "router": "vriksha.router.cli",
    "fleet": "vriksha.router.fleet",
    "route": "vriksha.semantic.cli",
    "env": "vriksha.envs.cli",
    "repo2env": "vriksha.repo2env.cli",
    "train": "vriksha.train.cli",
    "profile": "vriksha.profiling.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vriksha",
        description="vriksha: serve Transformers models on a radix-cache engine, build verifiable RL "
        "environments, train with GRPO on FSDP2, and profile all of it.",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help="logging level (DEBUG, INFO, WARNING, ERROR; default: INFO for serve and router, which say what "
        "they serve, where and when they are ready, WARNING for the rest)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = args.log_level or getattr(args, "default_log_level", "WARNING")  # a subcommand may set its own
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except VrikshaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
