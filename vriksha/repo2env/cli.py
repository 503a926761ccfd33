"""`vriksha repo2env SOURCE --out DIR` builds tasks; `vriksha repo2env validate DIR` re-checks them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vriksha.errors import ConfigError

__all__ = ["register", "handle"]

HELP = """\
Turn a Python project and its tests into validated coding tasks.

  vriksha repo2env SOURCE --out DIR [--pipelines ...] [--max-tasks N] [--workers N]
  vriksha repo2env validate DIR       (re-runs every task's oracle and empty check)

SOURCE is a local directory, a git checkout (enables the commit pipeline), an sdist archive
(.tar.gz/.zip) or NAME==VERSION fetched from the package index. `validate` as the first
positional selects the validate mode.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "repo2env",
        help="turn a Python repository into verifiable coding tasks",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="project directory, git checkout, sdist, NAME==VERSION, or the word `validate`",
    )
    p.add_argument(
        "dataset", metavar="DIR", nargs="?", help="with `validate`: the dataset directory to re-check"
    )
    p.add_argument("--out", type=Path, help="output dataset directory (required when building)")
    p.add_argument(
        "--pipelines",
        nargs="+",
        default=None,
        help="pipelines to run (implement_function fix_bug commit; default all)",
    )
    from vriksha.repo2env.build_config import BuildConfig

    names = BuildConfig.flag_names()
    BuildConfig.add_arguments(p, exclude=[n for n in BuildConfig.option_names() if n not in names])
    p.add_argument("--sandbox", action=_SandboxRemoved, nargs=0, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=handle)


class _SandboxRemoved(argparse.Action):
    """`--sandbox` changed nothing (every test run is sandboxed) and is gone; say so instead of a bare
    'unrecognized arguments'."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        parser.error("--sandbox is gone: every test run is sandboxed already; drop the flag")


def handle(args: argparse.Namespace) -> int:
    if args.source == "validate":
        return _validate(args)
    from vriksha.repo2env.builder import DEFAULT_PIPELINES, BuildConfig, build_dataset

    if args.out is None:
        raise ConfigError("--out DIR is required to build tasks (vriksha repo2env SOURCE --out DIR)")
    cfg = BuildConfig.from_args(
        args, pipelines=tuple(args.pipelines or DEFAULT_PIPELINES), progress=not args.no_progress
    )
    if cfg.baseline_runs < 2:
        raise ConfigError("--baseline-runs must be at least 2 (flaky tests are told by comparing runs)")
    report, manifest = build_dataset(args.source, args.out, cfg)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.render())
    print(f"{len(manifest.tasks)} task(s) written to {args.out}", file=sys.stderr)
    return 0 if manifest.tasks else 3


def _validate(args: argparse.Namespace) -> int:
    from vriksha.repo2env.dataset_check import validate_dataset

    if not args.dataset:
        raise ConfigError("usage: vriksha repo2env validate DIR")
    checks = validate_dataset(args.dataset, progress=not args.no_progress)
    bad = [c for c in checks if not c.ok]
    if args.json:
        print(
            json.dumps(
                [
                    {"task": c.task_id, "ok": c.ok, "oracle": c.oracle, "empty": c.empty, "error": c.error}
                    for c in checks
                ],
                indent=1,
            )
        )
    else:
        for c in checks:
            status = "ok" if c.ok else "FAIL"
            print(
                f"{status:4} {c.task_id}  oracle={'1.0' if c.oracle_resolved else '0.0'} "
                f"empty={'1.0' if c.empty_resolved else '0.0'} {c.error}"
            )
        print(f"{len(checks) - len(bad)}/{len(checks)} task(s) re-validate")
    return 0 if checks and not bad else 1
