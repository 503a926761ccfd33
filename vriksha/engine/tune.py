"""`vriksha tune`: time this machine's engine choices again, now, for the embedded default model or
`--model`, with the engine options a server would be started with (under --dtype fastest unless told: the
dtype, the linear paths, the packed kernels, native decode). What it measures replaces the cache dir's records;
a timing taken while other work ran is kept marked as such and taken again on the next load
(`vriksha/timing_load.py`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from vriksha.engine.config import EngineConfig

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="time this machine's engine choices again (dtype, linear paths, packed kernels, native decode)",
        description="Load the model as `vriksha serve` or `generate` would with the same engine options, timing "
        "every per-machine choice again instead of reading the cache dir, and say when each was measured and "
        "under what load. Run it on a quiet machine: a timing taken while other work used more than "
        "$VRIKSHA_TIMING_MAX_LOAD of the CPUs (default 0.25) is timed again on the next load, and the command "
        "exits 1. It times the choices --dtype fastest makes unless you name another --dtype: the faithful default "
        "(--dtype auto) runs the model's own dtype and times nothing but the linear paths and native decode.",
    )
    EngineConfig.add_arguments(p)
    p.set_defaults(func=run, default_log_level="INFO")


def run(args: argparse.Namespace) -> int:
    from vriksha import timing_load
    from vriksha.engine.llm_engine import LLMEngine
    from vriksha.fast_dtype import ENV_PIN

    config = EngineConfig.from_args(args, dtype="fastest")
    if config.dtype == "auto" and os.environ.get(ENV_PIN):
        logger.warning("$%s pins --dtype auto to %s: the dtype is not timed", ENV_PIN, os.environ[ENV_PIN])
    with timing_load.remeasuring():
        engine = LLMEngine(config)
        engine.close()
    for line in timing_load.report():
        print(line)
    busy = timing_load.busy_records()
    if busy:
        print(
            f"error: the {', '.join(busy)} timings were taken while other work ran; they serve until the next "
            "load, which times them again: run `vriksha tune` again on a quiet machine",
            file=sys.stderr,
        )
        return 1
    return 0
