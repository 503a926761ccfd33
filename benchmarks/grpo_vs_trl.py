"""GRPO side by side: vriksha's trainer vs TRL's `GRPOTrainer`, same model, reward and sizes, in one run.

    python benchmarks/grpo_vs_trl.py                       # 12 steps each, 8 prompts x 8 generations x 32 tokens
    python benchmarks/grpo_vs_trl.py --steps 1             # a smoke run
    python benchmarks/grpo_vs_trl.py --only vriksha        # one side
    python benchmarks/grpo_vs_trl.py --only vriksha --modes sync,async,server,server-async --eval-episodes 128
                                                           # vriksha's rollout modes against each other

Both sides train the embedded SmolLM2-135M-Instruct (float32, CPU unless CUDA is present) on the
`arithmetic` environment (level 1: one-digit a + b or a - b) with the environment's reward (0.9 for
the right final number, +0.1 for `Answer: N`), learning rate 1e-5 by default, temperature 1, one
optimizer step per 8 x 8 completions, no KL term. Each side runs in its own subprocess, one after
the other, so they never compete for the CPU. Printed: seconds per step (median of steps 2..N and
mean), mean reward at the start and end, wall time until the moving-average reward reaches the
target, and the speed ratio; written: `<out>/grpo_vs_trl.json` and `<out>/grpo_vs_trl.png`.

vriksha's modes (`--modes`): `sync` (colocated engine, play then train: the default side), `async`
(colocated, `rollout.max_staleness` K: a producer thread plays the next batch under weights K versions
old while this one trains), `server` (one `vriksha serve` process, weights pushed after each update) and
`server-async` (the server plays the next batch while the trainer trains). In the server modes the
trainer process and the server are pinned to disjoint halves of the CPUs (`--trainer-cores`,
`--server-cores`), each with as many threads as cores; the colocated modes get all of them. Compared:
steps per hour (from the median step time) and held-out success (`--eval-episodes`, greedy, before and
after) against `sync`: a mode is faster at equal success when its success is within the seeds' spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per side")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="generations per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (both sides unless --vriksha-lr)")
    p.add_argument("--vriksha-lr", type=float, default=None, help="vriksha's learning rate, if different")
    p.add_argument("--level", type=int, default=1, help="arithmetic level (1: one-digit + and -)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.8, help="reward whose first crossing is timed")
    p.add_argument("--only", choices=["both", "trl", "vriksha"], default="both")
    p.add_argument(
        "--modes",
        default="sync",
        help="vriksha's rollout modes, comma-separated: sync, async, server, server-async",
    )
    p.add_argument("--max-staleness", type=int, default=1, help="K of the async modes")
    p.add_argument(
        "--eval-episodes", type=int, default=0, help="held-out episodes before and after (vriksha)"
    )
    p.add_argument("--trainer-cores", default=None, help="server modes: CPUs of the trainer, e.g. 0")
    p.add_argument("--server-cores", default=None, help="server modes: CPUs of the server, e.g. 1")
    p.add_argument("--out", default="runs/bench_grpo", help="output directory")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="take a side that --only skips from <out>/<side>_rows.json of a past run",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: unknown {bad or modes}; choose from {', '.join(MODES)}")
    args.mode_list = modes
    return args


MODES = ("sync", "async", "server", "server-async")


def side_name(mode: str) -> str:
    return "vriksha" if mode == "sync" else f"vriksha-{mode}"


def _cores(spec: str | None, default: set[int]) -> set[int]:
    return default if spec is None else {int(c) for c in spec.split(",") if c.strip()}


def pinned_server(args: argparse.Namespace, out: Path):
    """A `vriksha serve` of the embedded model on the server cores; this process moves to the trainer cores."""
    import torch

    from vriksha.engine.config import EngineConfig
    from vriksha.train.server_rollout import LocalServer, engine_flags

    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    trainer = _cores(args.trainer_cores, set(cpus[:half]))
    server = _cores(args.server_cores, set(cpus[half:]) or set(cpus))
    os.sched_setaffinity(0, server)  # the server inherits the mask and the thread count at fork
    os.environ["OMP_NUM_THREADS"] = str(len(server))
    try:
        srv = LocalServer(None, engine_flags(EngineConfig(), "float32"), out / "server.log")
    finally:
        os.sched_setaffinity(0, trainer)
    torch.set_num_threads(len(trainer))
    print(f"   trainer on CPUs {sorted(trainer)}, server on CPUs {sorted(server)} ({srv.url})", flush=True)
    return srv


# ---------------------------------------------------------------- the two workers


def run_trl(args: argparse.Namespace, out: Path) -> list[dict]:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from vriksha.envs.trl_adapter import build_dataset, make_reward_func
    from vriksha.loading import load_model

    loaded = load_model(None, dtype=torch.float32)
    completions = args.prompts * args.group
    per_device = min(completions, 8)
    dataset = build_dataset(
        "arithmetic", max(256, args.steps * args.prompts), options={"level": args.level}, seed=args.seed
    )
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=completions // per_device,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        beta=0.0,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        seed=args.seed,
        disable_dropout=True,
        # the same arithmetic as vriksha's side: float32 (TRL's default bf16 autocast runs at a fifth of the
        # fp32 matmul speed on a CPU without bf16 instructions), and no activation recomputation
        bf16=False,
        gradient_checkpointing=False,
    )
    rows: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            rows.append({"step": state.global_step, "seconds": time.perf_counter() - self.t0})

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs and rows:
                rows[-1]["reward"] = float(logs["reward"])

    trainer = GRPOTrainer(
        model=loaded.model,
        processing_class=loaded.tokenizer,
        reward_funcs=[make_reward_func("arithmetic")],
        args=config,
        train_dataset=dataset,
        callbacks=[Timer()],
    )
    trainer.train()
    return rows


def run_vriksha(args: argparse.Namespace, out: Path, mode: str = "sync") -> list[dict]:
    from vriksha.train.config import TrainConfig
    from vriksha.train.distributed import shutdown_distributed
    from vriksha.train.metrics import read_jsonl
    from vriksha.train.trainer import GRPOTrainer

    cfg = TrainConfig.from_dict(
        {
            "model": {"path": None, "mixed_precision": "none"},  # fp32, as TRL's side
            "env": {"name": "arithmetic", "options": {"level": args.level}},
            "rollout": {
                "group_size": args.group,
                "prompts_per_step": args.prompts,
                "max_new_tokens": args.max_new_tokens,
                "temperature": 1.0,
                "mode": "server" if mode.startswith("server") else "colocated",
                "max_staleness": args.max_staleness if mode.endswith("async") else 0,
            },
            "optim": {"lr": args.vriksha_lr or args.lr},
            "grpo": {"micro_batch_groups": 4},  # 4 groups of 8 per forward/backward: bigger CPU matmuls
            "trainer": {
                "steps": args.steps,
                "seed": args.seed,
                "eval_episodes": args.eval_episodes,
                "output_dir": str(out / side_name(mode)),
                "export": False,
                "tensorboard": False,
            },
        }
    )
    server = pinned_server(args, out) if mode.startswith("server") else None
    if server is not None:
        cfg.rollout.servers = [server.url]
    try:
        GRPOTrainer(cfg).fit()
    finally:
        shutdown_distributed()
        if server is not None:
            server.stop()
    run = out / side_name(mode)
    evals = read_jsonl(run / "eval.jsonl")
    rows = [
        {
            "step": r["step"],
            "seconds": r["time/step_s"],
            "reward": r["reward/mean"],
            "staleness": r.get("async/staleness_mean", 0.0),
        }
        for r in read_jsonl(run / "metrics.jsonl")
    ]
    if evals and rows:
        rows[0]["eval_before"] = evals[0]["success_rate"]
        rows[-1]["eval_after"] = evals[-1]["success_rate"]
    return rows


# ---------------------------------------------------------------- comparison


def summarise(rows: list[dict], target: float) -> dict:
    secs = [r["seconds"] for r in rows]
    rewards = [r.get("reward") for r in rows]
    steady = secs[1:] or secs
    crossed, elapsed = None, 0.0
    for i, r in enumerate(rows):
        elapsed += r["seconds"]
        window = [x for x in rewards[max(0, i - 2) : i + 1] if x is not None]
        if crossed is None and window and sum(window) / len(window) >= target:
            crossed = elapsed
    head = [x for x in rewards[:3] if x is not None]
    tail = [x for x in rewards[-3:] if x is not None]
    return {
        "steps": len(rows),
        "s_per_step_median": statistics.median(steady) if steady else None,
        "s_per_step_mean": sum(secs) / len(secs) if secs else None,
        "first_step_s": secs[0] if secs else None,
        "reward_start": sum(head) / len(head) if head else None,
        "reward_end": sum(tail) / len(tail) if tail else None,
        "seconds_to_target": crossed,
        "total_s": sum(secs),
        "steps_per_hour": 3600.0 / statistics.median(steady) if steady else None,
        "eval_before": next((r["eval_before"] for r in rows if "eval_before" in r), None),
        "eval_after": next((r["eval_after"] for r in rows if "eval_after" in r), None),
        "staleness_mean": sum(r.get("staleness", 0.0) for r in rows) / len(rows) if rows else None,
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, data in results.items():
        rows = data["rows"]
        t, acc = [], 0.0
        for r in rows:
            acc += r["seconds"]
            t.append(acc / 60)
        rw = [r.get("reward", float("nan")) for r in rows]
        a.plot([r["step"] for r in rows], rw, marker=".", label=name)
        b.plot(t, rw, marker=".", label=name)
    a.set_xlabel("step")
    b.set_xlabel("wall time (min)")
    for ax in (a, b):
        ax.set_ylabel("mean training reward")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        if args.worker == "trl":
            rows = run_trl(args, out)
        else:
            mode = next(m for m in MODES if side_name(m) == args.worker)
            rows = run_vriksha(args, out, mode)
        (out / f"{args.worker}_rows.json").write_text(json.dumps(rows))
        return 0
    vriksha_sides = [side_name(m) for m in args.mode_list]
    sides = {"both": ["trl", *vriksha_sides], "trl": ["trl"], "vriksha": vriksha_sides}[args.only]
    results = {}
    if args.reuse:
        for side in {"trl", *map(side_name, MODES)} - set(sides):
            past = out / f"{side}_rows.json"
            if past.is_file():
                rows = json.loads(past.read_text())
                results[side] = {"rows": rows, "summary": summarise(rows, args.target), "reused": True}
                print(f"== {side}: reusing {past}")
    for side in sides:
        forwarded = list(argv if argv is not None else sys.argv[1:])
        if "--only" in forwarded:
            i = forwarded.index("--only")
            del forwarded[i : i + 2]
        forwarded = [a for a in forwarded if not a.startswith("--only=")]
        cmd = [sys.executable, __file__, *forwarded, "--worker", side]
        print(f"== {side}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=dict(os.environ))
        if proc.returncode != 0:
            print(f"{side} failed with exit code {proc.returncode}", file=sys.stderr)
            return proc.returncode
        rows = json.loads((out / f"{side}_rows.json").read_text())
        results[side] = {
            "rows": rows,
            "summary": summarise(rows, args.target),
            "wall_s": time.perf_counter() - t0,
        }

    print(
        f"\nGRPO, SmolLM2-135M, arithmetic level {args.level}: {args.prompts} prompts x {args.group} "
        f"generations x {args.max_new_tokens} new tokens, lr {args.lr}"
        f"{f' (vriksha {args.vriksha_lr})' if args.vriksha_lr else ''}, {args.steps} steps"
    )
    print(
        f"{'':22} {'s/step (median)':>16} {'s/step (mean)':>14} {'reward start':>13} {'reward end':>11} "
        f"{'s to ' + str(args.target):>10} {'steps/h':>8} {'held-out':>13} {'stale':>6}"
    )
    for side, r in results.items():
        s = r["summary"]

        def f(x, fmt):
            return "n/a" if x is None else format(x, fmt)

        held = "n/a"
        if s.get("eval_before") is not None and s.get("eval_after") is not None:
            held = f"{100 * s['eval_before']:.0f}->{100 * s['eval_after']:.0f}%"
        print(
            f"{side:22} {f(s['s_per_step_median'], '.2f'):>16} {f(s['s_per_step_mean'], '.2f'):>14} "
            f"{f(s['reward_start'], '.3f'):>13} {f(s['reward_end'], '.3f'):>11} "
            f"{f(s['seconds_to_target'], '.0f'):>10} {f(s.get('steps_per_hour'), '.0f'):>8} {held:>13} "
            f"{f(s.get('staleness_mean'), '.2f'):>6}"
        )
    if "trl" in results and "vriksha" in results:
        t, v = results["trl"]["summary"], results["vriksha"]["summary"]
        if t["s_per_step_median"] and v["s_per_step_median"]:
            ratio = t["s_per_step_median"] / v["s_per_step_median"]
            print(f"\nspeed: vriksha is {ratio:.2f}x faster per step than TRL's GRPOTrainer")
            results["ratio_s_per_step"] = ratio
        if t["seconds_to_target"] and v["seconds_to_target"]:
            print(
                f"time to reward {args.target}: {v['seconds_to_target'] / t['seconds_to_target']:.2f} of TRL's"
            )
    base = results.get("vriksha", {}).get("summary", {}).get("steps_per_hour")
    for side in vriksha_sides:
        other = results.get(side, {}).get("summary", {}).get("steps_per_hour")
        if side != "vriksha" and base and other:
            print(f"{side}: {other / base:.2f}x the steps per hour of sync colocated")
            results[f"ratio_steps_per_hour/{side}"] = other / base
    (out / "grpo_vs_trl.json").write_text(json.dumps({"args": vars(args), **results}, indent=2))
    plot({k: v for k, v in results.items() if isinstance(v, dict) and "rows" in v}, out / "grpo_vs_trl.png")
    print(f"\nwrote {out / 'grpo_vs_trl.json'} and {out / 'grpo_vs_trl.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
