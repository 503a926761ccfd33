"""`vriksha train CONFIG [--set key=value ...] [--resume] [--nproc N]`.

`--nproc N` (N > 1) re-executes the same command through `torchrun --nproc_per_node=N -m vriksha.train`;
`torchrun ... -m vriksha.train CONFIG ...` works directly too.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from typing import Any

from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["register", "build_parser", "handler", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="training config (.yaml/.yml/.toml); see configs/")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optim.lr=2e-5 --set rollout.group_size=4 (repeatable)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in output_dir"
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes (ranks) to train with; >1 re-executes through torchrun",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    from vriksha.engine.config import EngineConfig
    from vriksha.train.config import POLICY_ENGINE_OPTIONS

    # the same as --set rollout.engine.NAME=VALUE
    EngineConfig.add_arguments(parser, exclude=POLICY_ENGINE_OPTIONS, title="rollout engine")
    try:
        from vriksha.profiling import add_profile_args

        add_profile_args(parser)
    except ImportError:  # pragma: no cover
        pass


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="GRPO post-training on an environment (FSDP2; --nproc N for N processes)",
        description="Train a model with GRPO on a verifiable environment, rollouts on the colocated engine.",
    )
    add_arguments(parser)
    parser.set_defaults(func=handler)


def _torchrun(args: argparse.Namespace, argv: list[str]) -> int:
    torchrun = shutil.which("torchrun")
    base = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*base, "--standalone", f"--nproc_per_node={args.nproc}", "-m", "vriksha.train", *argv]
    logger.info("launching %s", " ".join(cmd))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    return subprocess.call(cmd, env=env)


def _strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def handler(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from vriksha.engine.config import EngineConfig
    from vriksha.train.config import engine_overrides, load_config

    cfg = load_config(args.config, args.overrides + engine_overrides(EngineConfig.given_args(args)))
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return 0
    if args.nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {args.nproc}")
    if args.nproc > 1 and "RANK" not in os.environ:
        if argv is None:
            argv = sys.argv[sys.argv.index("train") + 1 :] if "train" in sys.argv else sys.argv[1:]
        return _torchrun(args, _strip_nproc(argv))

    from vriksha.train.distributed import shutdown_distributed
    from vriksha.train.trainer import GRPOTrainer

    profile = None
    if getattr(args, "profile", False):
        from vriksha.profiling import ProfileConfig

        profile = ProfileConfig.from_args(args)
    try:
        trainer = GRPOTrainer(cfg, resume=args.resume, profile=profile)
        summary = trainer.fit()
        if trainer.pd.is_main:
            if summary.get("before") or summary.get("after"):
                print(summary["table"] + "\n")
            print(f"outputs in {cfg.trainer.output_dir}")
    finally:
        shutdown_distributed()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vriksha.train", description=__doc__)
    parser.add_argument("--log-level", default="WARNING", help="logging level")
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    from vriksha.errors import VrikshaError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return handler(args, argv)
    except VrikshaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
