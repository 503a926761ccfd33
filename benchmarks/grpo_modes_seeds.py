"""vriksha's rollout modes over seeds: `grpo_vs_trl.py --only vriksha --modes ...` once per seed, then each
mode's speed and held-out learning as mean and spread.

    python benchmarks/grpo_modes_seeds.py --seeds 0,1,2                      # sync, async, server, server-async
    python benchmarks/grpo_modes_seeds.py --seeds 0,1,2 --reuse              # table from finished seeds only
    python benchmarks/grpo_modes_seeds.py --seeds 0,1 --modes sync,async -- --steps 4 --eval-episodes 32

Each seed is one `grpo_vs_trl.py` run (its modes one after the other, each in its own process) into
`<out>/seed<S>`; arguments after `--` go to it unchanged (default: `--eval-episodes 128`). Printed per
mode: steps per hour (from each run's median step time) and its ratio to `sync` of the same seed, the
whole run's seconds, held-out success before and after, the gain, and the paired difference to `sync`'s
held-out success (a mode learns as well as `sync` where that difference is within its spread). Written:
`<out>/modes_seeds.json` and `<out>/modes_seeds.png` (steps per hour and held-out success per mode, the
mean as a bar, each seed a dot).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_seeds import spread  # noqa: E402
from grpo_vs_trl import MODES, side_name  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else ["--eval-episodes", "128"]
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (at least 3 for a spread)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--out", default="runs/grpo_modes_seeds", help="one sub-directory per seed goes here")
    p.add_argument("--reuse", action="store_true", help="read finished seeds instead of running them again")
    p.add_argument(
        "--add",
        type=Path,
        default=None,
        metavar="JSON",
        help="a modes_seeds.json of an earlier run: its seeds join this table (machines named per seed)",
    )
    args = p.parse_args(own)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds: expected integers like 0,1,2, got {args.seeds!r}")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad or not args.mode_list or not args.seed_list:
        p.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}" if bad else "give seeds and modes")
    for flag in ("--seed", "--out", "--only", "--modes"):
        if any(a == flag or a.startswith(flag + "=") for a in passthrough):
            p.error(f"{flag} after `--` is set by this script; drop it")
    args.passthrough = passthrough
    return args


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> None:
    script = Path(__file__).resolve().parent / "grpo_vs_trl.py"
    cmd = [sys.executable, str(script), "--only", "vriksha", "--modes", ",".join(args.mode_list)]
    cmd += ["--seed", str(seed), "--out", str(out), *args.passthrough]
    print(f"seed {seed}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True)


def read_seed(out: Path, modes: list[str]) -> dict[str, dict] | None:
    """Mode -> that run's summary, or None when the seed has not finished every mode."""
    path = out / "grpo_vs_trl.json"
    if not path.is_file():
        return None
    results = json.loads(path.read_text())
    found = {m: results[side_name(m)]["summary"] for m in modes if side_name(m) in results}
    return found if len(found) == len(modes) else None


FIELDS = {  # summary key -> row key
    "steps_per_hour": "steps_per_hour",
    "total_s": "total_s",
    "staleness_mean": "staleness",
    "eval_before": "eval_before",
    "eval_after": "eval_after",
}


def read_report(path: Path, modes: list[str]) -> tuple[dict[int, dict[str, dict]], dict[int, str]]:
    """The per-seed summaries and machines a modes_seeds.json holds (a figure missing for some seed is left out
    for all of them)."""
    report = json.loads(path.read_text())
    by_mode = {r["mode"]: r for r in report["rows"]}
    missing = [m for m in modes if m not in by_mode]
    if missing:
        raise SystemExit(f"--add {path}: it has no rows for {', '.join(missing)}")
    per_seed: dict[int, dict[str, dict]] = {}
    for mode in modes:
        row = by_mode[mode]
        for i, seed in enumerate(row["seeds"]):
            per_seed.setdefault(seed, {})[mode] = {
                key: row[col]["values"][i] if len(row[col]["values"]) == len(row["seeds"]) else None
                for key, col in FIELDS.items()
            }
    machines = {int(k): v for k, v in report.get("machines", {}).items()}
    return per_seed, {s: machines.get(s, report.get("machine", "unrecorded")) for s in per_seed}


def summarise(per_seed: dict[int, dict[str, dict]], modes: list[str]) -> list[dict]:
    """One row per mode: mean, sample sd and every seed's value of speed and held-out success."""
    rows = []
    for mode in modes:
        runs = [per_seed[s][mode] for s in per_seed]
        sync = [per_seed[s].get("sync") for s in per_seed]
        row: dict = {
            "mode": mode,
            "seeds": list(per_seed),
            "steps_per_hour": _stat([r["steps_per_hour"] for r in runs]),
            "total_s": _stat([r["total_s"] for r in runs]),
            "staleness": _stat([r.get("staleness_mean") for r in runs]),
            "eval_before": _stat([r.get("eval_before") for r in runs]),
            "eval_after": _stat([r.get("eval_after") for r in runs]),
            "gain": _stat([_diff(r.get("eval_after"), r.get("eval_before")) for r in runs]),
        }
        if all(s is not None for s in sync):
            pairs = list(zip(runs, sync, strict=True))
            row["vs_sync"] = _stat([_ratio(r["steps_per_hour"], s["steps_per_hour"]) for r, s in pairs])
            row["after_minus_sync"] = _stat(
                [_diff(r.get("eval_after"), s.get("eval_after")) for r, s in pairs]
            )
        rows.append(row)
    return rows


def _stat(values: list[float | None]) -> dict:
    got = [float(v) for v in values if v is not None]
    return {"values": got, "mean": statistics.mean(got) if got else None, "std": spread(got)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _fmt(stat: dict | None, scale: float = 1.0, fmt: str = ".1f", sign: bool = False) -> str:
    if not stat or stat["mean"] is None:
        return "-"
    spec = ("+" if sign else "") + fmt
    return f"{format(scale * stat['mean'], spec)} ± {format(scale * stat['std'], fmt)}"


def print_table(rows: list[dict]) -> None:
    head = [
        "mode",
        "steps/h",
        "vs sync",
        "whole run s",
        "held-out before",
        "after",
        "gain, points",
        "after - sync",
    ]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for r in rows:
        cells = [
            r["mode"],
            _fmt(r["steps_per_hour"], fmt=".0f"),
            _fmt(r.get("vs_sync"), fmt=".2f") + "x" if r.get("vs_sync") else "-",
            _fmt(r["total_s"], fmt=".0f"),
            _fmt(r["eval_before"], 100) + "%",
            _fmt(r["eval_after"], 100) + "%",
            _fmt(r["gain"], 100, sign=True),
            _fmt(r.get("after_minus_sync"), 100, sign=True),
        ]
        print("| " + " | ".join(cells) + " |")


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    # seeds may come from different machines (--add): the speed panel shows each seed's ratio to its own sync
    paired = all(r.get("vs_sync") for r in rows)
    speed = (
        ("vs_sync", "steps per hour / sync's (same seed)") if paired else ("steps_per_hour", "steps per hour")
    )
    for ax, key, scale, label in (
        (axes[0], speed[0], 1.0, speed[1]),
        (axes[1], "eval_after", 100.0, "held-out success after, %"),
    ):
        for i, r in enumerate(rows):
            s = r.get(key)
            if not s or s["mean"] is None:
                continue
            ax.bar(i, scale * s["mean"], yerr=scale * s["std"], color="C0", alpha=0.5, capsize=4)
            ax.plot([i] * len(s["values"]), [scale * v for v in s["values"]], "ko", ms=3)
        ax.set_xticks(range(len(rows)), [r["mode"] for r in rows])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"rollout modes over {len(rows[0]['seeds'])} seeds (bar: mean ± sd, dot: a seed)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    from vriksha.engine.platform.cpu_features import cpu_features

    here = cpu_features().summary()
    per_seed: dict[int, dict[str, dict]] = {}
    machines: dict[int, str] = {}
    if args.add is not None:
        per_seed, machines = read_report(args.add, args.mode_list)
        clash = sorted(set(per_seed) & set(args.seed_list))
        if clash:
            print(f"seeds {clash} are in {args.add} already; give other --seeds", file=sys.stderr)
            return 2
    for seed in args.seed_list:
        seed_out = out / f"seed{seed}"
        found = read_seed(seed_out, args.mode_list) if args.reuse else None
        if found is None:
            if args.reuse:
                print(f"seed {seed}: not finished in {seed_out}; running it", flush=True)
            run_seed(args, seed, seed_out)
            found = read_seed(seed_out, args.mode_list)
        if found is None:
            print(
                f"seed {seed}: {seed_out / 'grpo_vs_trl.json'} lacks a mode of {args.mode_list}",
                file=sys.stderr,
            )
            return 1
        per_seed[seed] = found
        machines[seed] = here
    rows = summarise(per_seed, args.mode_list)
    print(
        f"\nrollout modes, {len(per_seed)} seeds ({', '.join(map(str, per_seed))}), {' '.join(args.passthrough)}"
    )
    print_table(rows)
    out.mkdir(parents=True, exist_ok=True)
    for seed, machine in machines.items():
        print(f"seed {seed}: {machine}")
    report = {
        "seeds": list(per_seed),
        "modes": args.mode_list,
        "passthrough": args.passthrough,
        "machines": machines,
        "rows": rows,
    }
    (out / "modes_seeds.json").write_text(json.dumps(report, indent=2))
    plot(rows, out / "modes_seeds.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
