"""`vriksha train CONFIG [--set key=value ...] [--resume] [--nproc N] [--nnodes N --node-rank R --rdzv-endpoint
HOST:PORT] [--launcher torchrun|ray]`.

`--nproc N` (N > 1) or `--nnodes N` (N > 1) re-executes the same command through torchrun (`launch/torchrun.py`:
`--standalone` on one node, else the rendezvous), also under Slurm's srun; `torchrun ... -m vriksha.train CONFIG
...` works directly too. `--launcher ray` places the job's roles on a Ray cluster (`launch/ray/`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vriksha.train.config import TrainConfig

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
    from vriksha.launch.protocol import LAUNCHERS
    from vriksha.launch.torchrun import TorchrunConfig
    from vriksha.net.flags import add_flags

    add_flags(parser, TorchrunConfig, "ranks and nodes (torchrun)")
    parser.add_argument(
        "--launcher",
        choices=tuple(LAUNCHERS),
        default="torchrun",
        help="where the job runs: torchrun (this node, or several with --nnodes) or ray (a Ray cluster: "
        "trainer ranks, rollout servers, router and environment servers placed by the config's launch.ray "
        "section; pip install 'vriksha[ray]') (default: torchrun)",
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
        help="GRPO post-training on an environment, SFT or on-policy distillation (the config's algorithm; FSDP2; "
        "--nproc N processes per node, --nnodes, --launcher ray)",
        description="Train a model with GRPO on a verifiable environment (rollouts on the colocated engine), "
        "with SFT on chat or trajectory JSONL, or by on-policy distillation from a teacher (`algorithm` in the config).",
    )
    add_arguments(parser)
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from vriksha.engine.config import EngineConfig
    from vriksha.train.config import engine_overrides, load_config

    cfg = load_config(args.config, args.overrides + engine_overrides(EngineConfig.given_args(args)))
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return 0
    from vriksha.launch.protocol import TrainJob, get_launcher
    from vriksha.launch.torchrun import from_args, strip_launch_flags

    ranks = from_args(args)
    if args.launcher == "torchrun":
        ranks = ranks.with_slurm()
    ranks.validate()
    if argv is None:
        argv = sys.argv[sys.argv.index("train") + 1 :] if "train" in sys.argv else sys.argv[1:]
    profile = None
    if getattr(args, "profile_enabled", False):
        from vriksha.profiling import ProfileConfig

        profile = ProfileConfig.from_args(args)
    job = TrainJob(cfg, strip_launch_flags(argv), args.resume, ranks, profile)
    return get_launcher(args.launcher).train(job)


def run_in_process(cfg: TrainConfig, resume: bool, profile: Any = None) -> int:
    """This process is one trainer rank (or the only one): train, then leave the process group."""
    from vriksha.train.distributed import shutdown_distributed
    from vriksha.train.trainer import GRPOTrainer

    try:
        if cfg.algorithm == "sft":
            from vriksha.train.sft import SFTTrainer

            trainer: GRPOTrainer | SFTTrainer = SFTTrainer(cfg, resume=resume, profile=profile)
        else:  # grpo, and opd (the GRPO loop with the teacher's per-token scores as its signal)
            trainer = GRPOTrainer(cfg, resume=resume, profile=profile)
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
