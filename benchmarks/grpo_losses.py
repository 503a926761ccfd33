"""The loss menu and the importance modes on the hard arithmetic config, over seeds; the exact on-policy mode's
rollout speed against the default engine.

    python benchmarks/grpo_losses.py                      # every variant below, 3 seeds, 10 steps, 128 held-out
    python benchmarks/grpo_losses.py --variants dapo,gspo --seeds 0 --steps 2 --eval-episodes 8   # a smoke run
    python benchmarks/grpo_losses.py --reuse              # the table from finished runs
    python benchmarks/grpo_losses.py --rollout-speed      # tokens/s of one step's rollouts, default vs exact

Each variant is `benchmarks/grpo_seeds.py CONFIG --set ...` into `<out>/<variant>` (one training per seed,
one after the other). Printed per variant: held-out success at step 0 and at the last step (mean ± sample sd
over seeds), the gain with its spread and worst seed, and seconds per step (the median step of each seed,
then the mean over seeds). The importance variants run off-policy (`rollout.max_staleness: 1`), where the
weights pi_old / mu differ from 1 by more than rounding. `--rollout-speed` plays the same step's groups on the
colocated engine and on the exact engine (`grpo.on_policy: exact`) over the same module and reports generated
tokens per second of each. Written: `<out>/losses.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STALE = ["rollout.max_staleness=1"]
VARIANTS: dict[str, list[str]] = {
    **{name: [f"grpo.loss_type={name}"] for name in ("grpo", "dr_grpo", "dapo", "bnpo", "gspo", "cispo")},
    "is_off": [*STALE, "grpo.importance_correction=false"],
    "is_token_truncate": [*STALE, "grpo.importance_level=token", "grpo.importance_mode=truncate"],
    "is_token_mask": [
        *STALE,
        "grpo.importance_level=token",
        "grpo.importance_mode=mask",
        "grpo.importance_min=0.5",
    ],
    "is_sequence_truncate": [*STALE, "grpo.importance_level=sequence", "grpo.importance_mode=truncate"],
    "is_sequence_mask": [
        *STALE,
        "grpo.importance_level=sequence",
        "grpo.importance_mode=mask",
        "grpo.importance_min=0.5",
    ],
    "off_policy_mask": [*STALE, "grpo.off_policy_mask_threshold=0.5"],
}


def _seeds_module():
    spec = importlib.util.spec_from_file_location("grpo_seeds", HERE / "grpo_seeds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/grpo_arithmetic_hard.yaml", help="training config")
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    p.add_argument("--seeds", default="0,1,2", help="trainer seeds")
    p.add_argument("--steps", type=int, default=10, help="training steps per run")
    p.add_argument("--eval-episodes", type=int, default=128, help="held-out problems, before and after")
    p.add_argument("--out", default="runs/grpo_losses", help="one sub-directory per variant")
    p.add_argument("--reuse", action="store_true", help="read finished seeds instead of training them")
    p.add_argument("--rollout-speed", action="store_true", help="only time the rollouts, default vs exact")
    p.add_argument("--prompts", type=int, default=4, help="--rollout-speed: groups played")
    args = p.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def seconds_per_step(out: Path) -> float:
    """The median step time of each seed's run, averaged over seeds."""
    medians = []
    for metrics in sorted(out.glob("seed*/metrics.jsonl")):
        times = [json.loads(x)["time/step_s"] for x in metrics.read_text().splitlines() if x.strip()]
        if times:
            medians.append(statistics.median(times))
    return statistics.mean(medians) if medians else float("nan")


def run_variants(args: argparse.Namespace) -> dict[str, dict]:
    seeds = _seeds_module()
    results = {}
    for name in args.variant_list:
        out = Path(args.out) / name
        argv = [
            args.config,
            "--seeds",
            args.seeds,
            "--eval-episodes",
            str(args.eval_episodes),
            "--out",
            str(out),
        ]
        sets = [f"trainer.steps={args.steps}", f"trainer.eval_interval={args.steps}", *VARIANTS[name]]
        for item in sets:
            argv += ["--set", item]
        if args.reuse:
            argv.append("--reuse")
        seeds.main(argv)
        rows = json.loads((out / "seeds.json").read_text())["rows"]
        first, last = rows[0], rows[-1]
        results[name] = {
            "overrides": VARIANTS[name],
            "before": [first["mean"], first["std"]],
            "after": [last["mean"], last["std"]],
            "gain": [last["gain_mean"], last["gain_std"], last["gain_min"]],
            "seconds_per_step": seconds_per_step(out),
        }
    return results


def print_variants(results: dict[str, dict]) -> None:
    print("| variant | held-out before | after | gain, points (worst) | s/step |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        b, a, g = r["before"], r["after"], r["gain"]
        print(
            f"| {name} | {100 * b[0]:.1f}% ± {100 * b[1]:.1f} | {100 * a[0]:.1f}% ± {100 * a[1]:.1f} "
            f"| {100 * g[0]:+.1f} ± {100 * g[1]:.1f} ({100 * g[2]:+.1f}) | {r['seconds_per_step']:.1f} |"
        )


def rollout_speed(args: argparse.Namespace) -> dict[str, float]:
    """One step's groups played on the colocated engine, then on the exact engine, over the same module."""
    import torch
    import yaml

    from vriksha.train.config import TrainConfig
    from vriksha.train.exact_engine import ExactEngine
    from vriksha.train.policy import load_policy
    from vriksha.train.rollout import StepRollout
    from vriksha.train.rollout_engine import colocated_engine

    data = yaml.safe_load(Path(args.config).read_text())
    data["rollout"].update({"prompts_per_step": args.prompts, "max_turns": 1, "dynamic_sampling_rounds": 0})
    cfg = TrainConfig.from_dict(data)
    module, tok = load_policy(cfg.model, 0)
    module.requires_grad_(False)
    rollout = StepRollout(tok, cfg.env, cfg.rollout, run_seed=0)
    engines = {
        "default": lambda: colocated_engine(module, tok, cfg.rollout.engine),
        "exact": lambda: ExactEngine(module, tok),
    }
    speeds: dict[str, float] = {}
    for name, build in engines.items():
        engine = build()
        t0 = time.perf_counter()
        with torch.no_grad():
            groups = rollout.play(engine, step=1).groups
        seconds = time.perf_counter() - t0
        tokens = sum(e.num_generated for g in groups for e in g)
        speeds[name] = tokens / seconds
        print(f"{name}: {tokens} tokens in {seconds:.1f} s: {speeds[name]:.1f} tokens/s", flush=True)
        engine.close()
    print(f"exact / default: {speeds['exact'] / speeds['default']:.3f}")
    return speeds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "losses.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    if args.rollout_speed:
        report["rollout_tokens_per_s"] = rollout_speed(args)
    else:
        report.setdefault("variants", {}).update(run_variants(args))
        report.update({"config": args.config, "seeds": args.seeds, "steps": args.steps})
        print_variants(report["variants"])
    report_path.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
