"""Held-out learning over seeds: one training config run once per seed, reported as mean and spread.

    python benchmarks/grpo_seeds.py configs/grpo_arithmetic_hard.yaml --seeds 0,1,2 --eval-episodes 128
    python benchmarks/grpo_seeds.py configs/grpo_arithmetic_hard.yaml --seeds 0,1,2 --reuse   # table only
    python benchmarks/grpo_seeds.py CONFIG --set optim.lr=5e-5 --out runs/seeds_lr5e-5       # a variant

Each seed is one `vriksha train CONFIG --set trainer.seed=S` in its own subprocess, one after the
other (two trainings at once on a small CPU slow each other down several times). Every evaluation
step the config makes (`trainer.eval_interval`) is read back from `<out>/seed<S>/eval.jsonl` and
`metrics.jsonl`. Printed: held-out success per seed at each evaluated step, the mean and sample
standard deviation over seeds, the gain over step 0 with its spread, and the training minutes to
that step (the mean over seeds and the slowest seed's; evaluations not included). Written: `<out>/seeds.json` and
`<out>/seeds.png` (mean held-out success against training minutes, one line per seed, the mean bold).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="training config (YAML), e.g. configs/grpo_arithmetic_hard.yaml")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated trainer seeds (at least 3 for a spread)")
    p.add_argument("--eval-episodes", type=int, default=128, help="held-out problems per evaluation")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra config override, repeatable"
    )
    p.add_argument("--out", default="runs/grpo_seeds", help="one sub-directory per seed goes here")
    p.add_argument("--reuse", action="store_true", help="read finished seeds' results instead of training")
    args = p.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds: expected integers like 0,1,2, got {args.seeds!r}")
    if not args.seed_list:
        p.error("--seeds: give at least one seed")
    return args


def train_seed(args: argparse.Namespace, seed: int, out: Path) -> None:
    cmd = [sys.executable, "-m", "vriksha", "train", args.config]
    overrides = [
        f"trainer.seed={seed}",
        f"trainer.eval_episodes={args.eval_episodes}",
        f"trainer.output_dir={out}",
        "trainer.export=false",
        *args.set,
    ]
    for item in overrides:
        cmd += ["--set", item]
    print(f"seed {seed}: {' '.join(cmd[2:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"seed {seed}: done in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)


def read_seed(out: Path) -> dict[int, dict[str, float]]:
    """Step -> held-out success and the training minutes up to that step."""
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines() if line.strip()]
    elapsed = {0: 0.0}
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if "time/elapsed_s" in row:
                elapsed[int(row["step"])] = float(row["time/elapsed_s"])
    return {
        int(e["step"]): {
            "success": float(e["success_rate"]),
            "train_min": elapsed.get(int(e["step"]), 0.0) / 60,
        }
        for e in evals
    }


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(per_seed: dict[int, dict[int, dict[str, float]]]) -> list[dict]:
    steps = sorted(set.intersection(*(set(r) for r in per_seed.values())))
    rows = []
    for step in steps:
        success = [per_seed[s][step]["success"] for s in per_seed]
        gain = [per_seed[s][step]["success"] - per_seed[s][steps[0]]["success"] for s in per_seed]
        rows.append(
            {
                "step": step,
                "success": success,
                "mean": statistics.mean(success),
                "std": spread(success),
                "gain_mean": statistics.mean(gain),
                "gain_std": spread(gain),
                "gain_min": min(gain),
                "train_min": statistics.mean(per_seed[s][step]["train_min"] for s in per_seed),
                "train_min_max": max(per_seed[s][step]["train_min"] for s in per_seed),
            }
        )
    return rows


def print_table(rows: list[dict], seeds: list[int]) -> None:
    head = (
        ["step", "train min (slowest)"]
        + [f"seed {s}" for s in seeds]
        + ["mean ± sd", "gain ± sd", "worst gain"]
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for r in rows:
        cells = [str(r["step"]), f"{r['train_min']:.1f} ({r['train_min_max']:.1f})"]
        cells += [f"{100 * v:.1f}%" for v in r["success"]]
        cells += [
            f"{100 * r['mean']:.1f}% ± {100 * r['std']:.1f}",
            f"{100 * r['gain_mean']:+.1f} ± {100 * r['gain_std']:.1f}",
            f"{100 * r['gain_min']:+.1f}",
        ]
        print("| " + " | ".join(cells) + " |")


def plot(per_seed: dict[int, dict[int, dict[str, float]]], rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for seed, by_step in per_seed.items():
        steps = sorted(by_step)
        ax.plot(
            [by_step[k]["train_min"] for k in steps],
            [100 * by_step[k]["success"] for k in steps],
            marker="o",
            alpha=0.45,
            label=f"seed {seed}",
        )
    ax.plot([r["train_min"] for r in rows], [100 * r["mean"] for r in rows], "k-o", lw=2.2, label="mean")
    ax.set_xlabel("training minutes (evaluations not included)")
    ax.set_ylabel("held-out success, %")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    per_seed: dict[int, dict[int, dict[str, float]]] = {}
    for seed in args.seed_list:
        seed_out = out / f"seed{seed}"
        if not (args.reuse and (seed_out / "eval.jsonl").exists()):
            train_seed(args, seed, seed_out)
        per_seed[seed] = read_seed(seed_out)
    rows = summarise(per_seed)
    print(f"\n{args.config} {' '.join(args.set)}: {len(per_seed)} seeds x {args.eval_episodes} held-out")
    print_table(rows, list(per_seed))
    out.mkdir(parents=True, exist_ok=True)
    report = {"config": args.config, "overrides": args.set, "seeds": list(per_seed), "rows": rows}
    (out / "seeds.json").write_text(json.dumps(report, indent=2))
    plot(per_seed, rows, out / "seeds.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
