"""`vriksha env list | validate NAME | eval NAME | serve NAME`."""

from __future__ import annotations

import argparse
import json
import logging
import sys

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    env = subparsers.add_parser("env", help="verifiable RL environments: list, validate, evaluate, serve")
    sub = env.add_subparsers(dest="env_command", metavar="ENV_COMMAND")
    env.set_defaults(func=lambda args: (env.print_help(), 2)[1])

    p = sub.add_parser("list", help="list the registered environments")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_list)

    p = sub.add_parser("validate", help="check an environment against the contract's invariants")
    p.add_argument("name", help="environment name (see `vriksha env list`) or package.module:Class")
    p.add_argument(
        "--seeds", type=int, default=12, help="seeds for determinism/variety/split checks (default 12)"
    )
    p.add_argument(
        "--adversarial-episodes", type=int, default=3, help="episodes for the adversarial floor (default 3)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _env_arg(p)
    p.set_defaults(func=_validate)

    p = sub.add_parser("eval", help="run a model through episodes; report reward, success and components")
    p.add_argument("name", help="environment name or package.module:Class")
    p.add_argument("--episodes", type=int, default=16, help="number of episodes (default 16)")
    p.add_argument("--split", default="test", help="train or test (default test: held-out episodes)")
    p.add_argument("--seed", type=int, default=0, help="first episode seed (default 0)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per model turn (default 256)")
    p.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="turns per episode at most (default: the environment's; the trainer's is rollout.max_turns)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument(
        "--samples",
        type=int,
        default=0,
        help="K: also play each episode K times at --sample-temperature and report pass@k (unbiased "
        "estimator) and avg@K beside the first run (default 0: none)",
    )
    p.add_argument(
        "--sample-temperature", type=float, default=1.0, help="temperature of the --samples runs (default 1)"
    )
    p.add_argument("--level", type=int, default=None, help="task level, for environments that have levels")
    p.add_argument(
        "--save",
        default=None,
        metavar="PATH",
        help="write every played episode (the --samples runs too) as a JSONL line to PATH: token ids, loss "
        "mask, reward and success (what `vriksha train` with algorithm sft takes as sft.data)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _env_arg(p)
    from vriksha.engine.config import EngineConfig

    EngineConfig.add_arguments(p)
    try:
        from vriksha.profiling import add_profile_args

        add_profile_args(p)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("vriksha"):
            raise
    p.set_defaults(func=_eval)

    try:
        from vriksha.envs.server_cli import register_serve
    except ModuleNotFoundError as exc:
        if exc.name != "vriksha.envs.server_cli":
            raise
    else:
        register_serve(sub)


def _env_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="constructor argument for the environment (repeatable; VALUE parsed as JSON when it can be), "
        "e.g. --env-arg dataset=out/ for `repo`",
    )


def _env_kwargs(pairs: list[str]) -> dict:
    from vriksha.errors import ConfigError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env-arg expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _list(args: argparse.Namespace) -> int:
    from vriksha.envs.registry import get_env_class, list_envs

    rows = []
    for name in list_envs():
        cls = get_env_class(name)
        meta = cls.metadata()
        rows.append({k: meta[k] for k in ("name", "description", "action_type", "splits", "max_turns")})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vriksha environments")
    for col in ("name", "description", "action", "turns", "splits"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"], r["description"], r["action_type"], str(r["max_turns"]), ", ".join(r["splits"])
        )
    Console().print(table)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from vriksha.envs.validate import validate_env

    console = Console(stderr=True)
    with console.status(f"validating {args.name}") as status:
        report = validate_env(
            args.name,
            seeds=args.seeds,
            adversarial_episodes=args.adversarial_episodes,
            env_kwargs=_env_kwargs(args.env_arg),
            progress=lambda msg: status.update(f"validating {args.name}: {msg}"),
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"validate {report.env}")
        for col in ("check", "result", "detail"):
            table.add_column(col)
        for c in report.checks:
            table.add_row(c.name, "[green]pass[/]" if c.ok else "[red]FAIL[/]", c.detail)
        Console().print(table)
        print(f"{report.env}: {'clean' if report.ok else f'{len(report.failed())} check(s) failed'}")
    return 0 if report.ok else 1


def _eval(args: argparse.Namespace) -> int:
    from vriksha.envs.eval import evaluate

    try:
        from vriksha.engine.config import EngineConfig
        from vriksha.engine.core.llm import LLM
    except (ImportError, AttributeError) as exc:
        print(
            f"error: the engine is not available ({exc}); `vriksha env eval` needs vriksha.engine",
            file=sys.stderr,
        )
        return 1
    config = EngineConfig.from_args(args)
    llm = LLM(config=config)
    profiler = None
    if getattr(args, "profile_enabled", False):
        from vriksha.profiling import ProfileConfig, StepProfiler

        profiler = StepProfiler(ProfileConfig.from_args(args), rank=0, name=f"env_eval_{args.name}")
        profiler.start()
    options = {"level": args.level} if args.level is not None else None
    try:
        result = evaluate(
            args.name,
            llm,
            episodes=args.episodes,
            split=args.split,
            seed=args.seed,
            max_tokens=args.max_tokens,
            max_turns=args.max_turns,
            temperature=args.temperature,
            reset_options=options,
            env_kwargs=_env_kwargs(args.env_arg),
            on_step=profiler.step if profiler is not None else None,
            progress=not args.no_progress,
            model_name=config.model or "embedded",
            samples=args.samples,
            sample_temperature=args.sample_temperature,
            save=args.save,
        )
    finally:
        if profiler is not None:
            for path in profiler.stop():
                print(f"trace: {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"env {result.env}  model {result.model}  split {result.split}  episodes {result.episodes}")
    print(f"mean reward   {result.mean_reward:.4f}")
    print(f"success rate  {result.success_rate:.4f}")
    print(f"mean turns    {result.mean_turns:.2f}")
    for k, v in result.components.items():
        print(f"  {k:<20} {v:.4f}")
    s = result.sampled
    if s is not None:
        print(f"sampled {s.samples} per episode at temperature {s.temperature:g}:")
        print(f"  avg@{s.samples:<9} {s.avg_success:.4f}  (mean reward {s.avg_reward:.4f})")
        for size, value in s.pass_at.items():
            print(f"  pass@{size:<8} {value:.4f}")
    print(f"{result.generated_tokens} tokens in {result.duration_s:.1f} s")
    if args.save:
        print(f"episodes saved to {args.save}")
    return 0
