"""`vriksha profile report TRACE... [--out chart.png] [--threshold 0.5]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vriksha.errors import ConfigError
from vriksha.profiling.analysis import DEFAULT_IDLE_GAP_MS, DEFAULT_KERNEL_GAP_US, DEFAULT_THRESHOLD


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="read torch.profiler traces", description="Read torch.profiler traces."
    )
    sub = p.add_subparsers(dest="profile_command", metavar="COMMAND")
    r = sub.add_parser(
        "report",
        help="explain where time went and whether it is overhead-bound",
        description="Explain one or more torch.profiler Chrome traces (.json or .json.gz, several ranks read "
        "together): time per phase, top operators, per-step compute share, the overhead-bound verdict, "
        "device idle gaps, and a PNG chart.",
    )
    r.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace files (.json or .json.gz)")
    r.add_argument("--out", type=Path, default=None, help="write a PNG breakdown chart here")
    r.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"overhead-bound when the compute share of step time is below this fraction (default: {DEFAULT_THRESHOLD})",
    )
    r.add_argument(
        "--kernel-gap-us",
        type=float,
        default=DEFAULT_KERNEL_GAP_US,
        help=f"device gaps shorter than this are kernel-to-kernel wait (default: {DEFAULT_KERNEL_GAP_US} µs, as HTA)",
    )
    r.add_argument(
        "--step-phase",
        default=None,
        metavar="NAME",
        help="treat each occurrence of this annotation (e.g. train.rollout) as a step instead of ProfilerStep#N",
    )
    r.add_argument(
        "--idle-gap-ms",
        type=float,
        default=DEFAULT_IDLE_GAP_MS,
        help="traces without step marks are split into busy windows at silences longer than this "
        f"(default: {DEFAULT_IDLE_GAP_MS:g} ms)",
    )
    r.add_argument("--top", type=int, default=15, help="how many operators and kernels to list (default: 15)")
    r.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON here")
    r.set_defaults(func=report_command)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def report_command(args: argparse.Namespace) -> int:
    from vriksha.profiling.chart import write_chart
    from vriksha.profiling.report import build, format_report, to_json

    if not 0.0 < args.threshold < 1.0:
        raise ConfigError(f"--threshold must be a fraction between 0 and 1, got {args.threshold}; e.g. 0.5")
    if args.top < 1:
        raise ConfigError(f"--top must be at least 1, got {args.top}")
    if args.idle_gap_ms <= 0:
        raise ConfigError(f"--idle-gap-ms must be positive, got {args.idle_gap_ms}")
    analysis = build(
        args.traces,
        threshold=args.threshold,
        kernel_gap_us=args.kernel_gap_us,
        step_phase=args.step_phase,
        idle_gap_ms=args.idle_gap_ms,
    )
    sys.stdout.write(format_report(analysis, top=args.top) + "\n")
    if args.out is not None:
        path = write_chart(analysis, args.out)
        sys.stdout.write(f"chart: {path}\n")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(to_json(analysis))
        sys.stdout.write(f"json: {args.json}\n")
    return 0
