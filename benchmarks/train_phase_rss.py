"""Where a `vriksha train` run's resident memory peaks: VmRSS at each boundary of the run (held-out evaluation,
rollout, the engine's sleep and wake-up, each forward/log-prob pass and backward of the update, the optimizer
step) and VmHWM, the peak since the previous boundary (reset at each through /proc/self/clear_refs, so the run's
peak is the largest `peak_since_last`; this also resets what `/usr/bin/time` and `ru_maxrss` report). Linux only.

    python benchmarks/train_phase_rss.py --json out.json -- train configs/grpo_demo.yaml --set trainer.steps=1

Each row goes to stderr as it happens (`RSSLOG {...}`); the list is written to `--json`. Before `sleep()` and
after each evaluation a row also has the KV pool's size, its slots in use and `pool_mapped_gib`: the pool's pages
that `mincore` reports resident, an upper bound (an untouched page that was read once maps the kernel's zero
page, which mincore counts and the resident set does not).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import torch

ROWS: list[dict] = []
T0 = time.monotonic()


def _status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 2**20  # kB -> GiB
    return out


def mark(label: str, **extra: object) -> None:
    s = _status()
    row = {
        "t": round(time.monotonic() - T0, 1),
        "label": label,
        "rss_gib": round(s["VmRSS"], 3),
        "peak_since_last_gib": round(s["VmHWM"], 3),
        **extra,
    }
    ROWS.append(row)
    print("RSSLOG", json.dumps(row), file=sys.stderr, flush=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


def _mapped_bytes(t: torch.Tensor) -> int:
    libc = ctypes.CDLL(None)
    page = os.sysconf("SC_PAGE_SIZE")
    start, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    if n == 0:
        return 0
    first = start // page * page
    pages = (start + n - first + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(pages * page), vec)
    return sum(b & 1 for b in vec) * page


def _pool(engine) -> dict[str, object]:
    pool = engine.pool
    return {
        "pool_gib": round(pool.nbytes / 2**30, 3),
        "pool_mapped_gib": round(sum(_mapped_bytes(t) for t in (*pool.k, *pool.v)) / 2**30, 3),
        "used_slots": engine.allocator.capacity - engine.allocator.num_free,
        "slots": engine.allocator.capacity,
    }


def _around(owner: object, name: str, before: str, after: str) -> None:
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        mark(before)
        out = inner(*args, **kwargs)
        mark(after)
        return out

    setattr(owner, name, wrapped)


def instrument() -> None:
    import vriksha.train.trainer as trainer
    from vriksha.engine.core.llm_engine import LLMEngine
    from vriksha.train.rollout import StepRollout

    sleep = LLMEngine.sleep

    def sleep_marked(self: LLMEngine) -> None:
        mark("before sleep", **_pool(self))
        sleep(self)
        mark("after sleep")

    LLMEngine.sleep = sleep_marked
    _around(LLMEngine, "wake_up", "before wake_up", "after wake_up")
    _around(StepRollout, "play", "before rollout", "after rollout")
    evaluate = trainer.GRPOTrainer.evaluate

    def evaluate_marked(self, step: int):
        mark(f"before evaluation at step {step}")
        out = evaluate(self, step)
        engine = getattr(self.llm, "engine", None)
        mark(f"after evaluation at step {step}", **(_pool(engine) if isinstance(engine, LLMEngine) else {}))
        return out

    trainer.GRPOTrainer.evaluate = evaluate_marked
    _around(trainer, "policy_update", "update start", "update end")
    _around(
        torch.Tensor, "backward", "before backward (after the forward and log-prob passes)", "after backward"
    )
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda *_: mark("before optimizer step"))
    register_optimizer_step_post_hook(lambda *_: mark("after optimizer step"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=Path("train_phase_rss.json"))
    parser.add_argument("vriksha_args", nargs=argparse.REMAINDER, help="after --: the vriksha command line")
    args = parser.parse_args()
    argv = (
        [a for a in args.vriksha_args if a != "--"] if args.vriksha_args[:1] == ["--"] else args.vriksha_args
    )
    instrument()
    mark("start")
    from vriksha.cli import main as vriksha_main

    try:
        rc = vriksha_main(argv)
    finally:
        mark("end")
        peak = max(ROWS, key=lambda r: r["peak_since_last_gib"])
        print(f"peak {peak['peak_since_last_gib']} GiB, reached before '{peak['label']}'", file=sys.stderr)
        args.json.write_text(json.dumps(ROWS, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
