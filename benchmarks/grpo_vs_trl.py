"""GRPO side by side: vriksha's trainer vs TRL's `GRPOTrainer`, same model, reward and sizes, in one run.

    python benchmarks/grpo_vs_trl.py                       # 12 steps each, 8 prompts x 8 generations x 32 tokens
    python benchmarks/grpo_vs_trl.py --steps 1             # a smoke run
    python benchmarks/grpo_vs_trl.py --only vriksha        # one side

Both sides train the embedded SmolLM2-135M-Instruct (float32, CPU unless CUDA is present) on the
`arithmetic` environment (level 1: one-digit a + b or a - b) with the environment's reward (0.9 for
the right final number, +0.1 for `Answer: N`), learning rate 1e-5 by default, temperature 1, one
optimizer step per 8 x 8 completions, no KL term. Each side runs in its own subprocess, one after
the other, so they never compete for the CPU. Printed: seconds per step (median of steps 2..N and
mean), mean reward at the start and end, wall time until the moving-average reward reaches the
target, and the speed ratio; written: `<out>/grpo_vs_trl.json` and `<out>/grpo_vs_trl.png`.
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
    p.add_argument("--out", default="runs/bench_grpo", help="output directory")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="take a side that --only skips from <out>/<side>_rows.json of a past run",
    )
    p.add_argument("--worker", choices=["trl", "vriksha"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


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


def run_vriksha(args: argparse.Namespace, out: Path) -> list[dict]:
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
            },
            "optim": {"lr": args.vriksha_lr or args.lr},
            "grpo": {"micro_batch_groups": 4},  # 4 groups of 8 per forward/backward: bigger CPU matmuls
            "trainer": {
                "steps": args.steps,
                "seed": args.seed,
                "eval_episodes": 0,
                "output_dir": str(out / "vriksha"),
                "export": False,
                "tensorboard": False,
            },
        }
    )
    try:
        GRPOTrainer(cfg).fit()
    finally:
        shutdown_distributed()
    return [
        {"step": r["step"], "seconds": r["time/step_s"], "reward": r["reward/mean"]}
        for r in read_jsonl(out / "vriksha" / "metrics.jsonl")
    ]


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
        rows = run_trl(args, out) if args.worker == "trl" else run_vriksha(args, out)
        (out / f"{args.worker}_rows.json").write_text(json.dumps(rows))
        return 0
    sides = ["trl", "vriksha"] if args.only == "both" else [args.only]
    results = {}
    if args.reuse:
        for side in {"trl", "vriksha"} - set(sides):
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
        f"{'':10} {'s/step (median)':>16} {'s/step (mean)':>14} {'reward start':>13} {'reward end':>11} {'s to ' + str(args.target):>10}"
    )
    for side, r in results.items():
        s = r["summary"]

        def f(x, fmt):
            return "n/a" if x is None else format(x, fmt)

        print(
            f"{side:10} {f(s['s_per_step_median'], '.2f'):>16} {f(s['s_per_step_mean'], '.2f'):>14} "
            f"{f(s['reward_start'], '.3f'):>13} {f(s['reward_end'], '.3f'):>11} {f(s['seconds_to_target'], '.0f'):>10}"
        )
    if len(results) == 2:
        t, v = results["trl"]["summary"], results["vriksha"]["summary"]
        if t["s_per_step_median"] and v["s_per_step_median"]:
            ratio = t["s_per_step_median"] / v["s_per_step_median"]
            print(f"\nspeed: vriksha is {ratio:.2f}x faster per step than TRL's GRPOTrainer")
            results["ratio_s_per_step"] = ratio
        if t["seconds_to_target"] and v["seconds_to_target"]:
            print(
                f"time to reward {args.target}: {v['seconds_to_target'] / t['seconds_to_target']:.2f} of TRL's"
            )
    (out / "grpo_vs_trl.json").write_text(json.dumps({"args": vars(args), **results}, indent=2))
    plot({k: v for k, v in results.items() if isinstance(v, dict) and "rows" in v}, out / "grpo_vs_trl.png")
    print(f"\nwrote {out / 'grpo_vs_trl.json'} and {out / 'grpo_vs_trl.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
