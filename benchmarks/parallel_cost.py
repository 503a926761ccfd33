"""What each mesh shape costs: GRPO update step time, memory per rank, communication and DTensor dispatch.

    python benchmarks/parallel_cost.py --model tiny --steps 2 --warmup 1          # a smoke run (minutes on 2 cores)
    python benchmarks/parallel_cost.py --model tiny --meshes 1x1,2x1,1x2,2x2 --profile
    python benchmarks/parallel_cost.py --model embedded --meshes 1x1,2x1,1x3,2x3            # time, memory
    python benchmarks/parallel_cost.py --model embedded --meshes 1x1,2x1,1x3 --profile      # + shares

A mesh `DxT` is `dp_shard x tp` on D*T processes (torchrun underneath; gloo on CPU, NCCL on
GPUs, one device per rank). Every mesh runs the same GRPO updates (`policy_update`, the
trainer's own) of the same synthetic episodes: `--groups` prompts x `--group-size` completions
of `--prompt-len` / `--completion-len` tokens, split over the data-parallel ranks. No rollouts:
this measures the update, which is what the mesh changes (the engine always runs on full weights).

Per mesh it reports the median step time (rank 0; ranks wait for one another), the peak resident
memory of every rank (and the peak CUDA allocation) and its peak per stage (imports, load,
sharding, each step), and the exact bytes of this rank's share of parameters + gradients + AdamW
state, all without the profiler. With `--profile`, each rank then records `--profile-steps` more
steps (after one profiler warmup step) with vriksha's profiler, `vriksha profile report` runs over the ranks' traces (saved as
`<out>/<mesh>/report.txt`), and from the same traces: the share of step time inside
collectives (self time of c10d / functional-collective operators, waits included) and in DTensor
dispatch (self time of the subclass dispatch, redistribution and local-tensor wrapping around
the real operators). Written: `<out>/parallel_cost.json` and `.md`; `--reanalyze` recomputes the
shares and tables from the traces of an earlier run in `--out`.

The embedded SmolLM2-135M has 9 attention heads over 3 KV heads: its tensor-parallel degree is
3 or 9, so a 1x2 mesh is refused for it (the row says why).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMM_MARKS = ("c10d::", "gloo", "nccl", "allreduce", "all_reduce", "allgather", "all_gather",
              "reduce_scatter", "_reduce_scatter", "broadcast", "wait_tensor", "record_param_comms")  # fmt: skip
# what DTensor adds around the local operators: the subclass dispatch (sharding propagation),
# redistribution planning, and wrapping / unwrapping local tensors (forward and backward)
DTENSOR_OPS = frozenset({"PythonSubclass", "Redistribute", "NestedRedistribute", "_FromTorchTensor",
                         "_FromTorchTensorBackward", "_ToTorchTensor", "_ToTorchTensorBackward"})  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "embedded"], default="tiny")
    p.add_argument(
        "--meshes", default=None, help="comma-separated DxT (default: 1x1,2x1,1x2,2x2; embedded: 1x3/2x3)"
    )
    p.add_argument("--steps", type=int, default=3, help="measured update steps per mesh")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--groups", type=int, default=4, help="prompts per step (a multiple of every dp degree)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--completion-len", type=int, default=32)
    p.add_argument("--micro-batch-groups", type=int, default=1)
    p.add_argument("--replicate-vocab", action="store_true", help="TP: replicate embedding and LM head")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the measured steps, record traces of --profile-steps more and report comm / DTensor shares",
    )
    p.add_argument("--profile-steps", type=int, default=1, help="profiled steps (one trace file per rank)")
    p.add_argument("--out", default="runs/bench_parallel", help="output directory")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per mesh")
    p.add_argument(
        "--reanalyze", action="store_true", help="rebuild tables from an earlier run's files in --out"
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------- one rank (under torchrun)


def _model(kind: str):
    import torch

    from vriksha.train.config import ModelConfig
    from vriksha.train.policy import load_policy

    if kind == "embedded":
        return load_policy(ModelConfig(), seed=0)[0]
    init = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return load_policy(ModelConfig(random_init=init), seed=0)[0]


def _episodes(args: argparse.Namespace, vocab: int) -> list[list]:
    import torch

    from vriksha.train.rollout import Episode

    g = torch.Generator().manual_seed(0)
    groups = []
    for gi in range(args.groups):
        prompt = torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
        group = []
        for m in range(args.group_size):
            comp = torch.randint(0, vocab, (args.completion_len,), generator=g).tolist()
            lps = (-torch.rand(args.completion_len, generator=g)).tolist()
            group.append(Episode(gi, m, gi, prompt, comp, lps, [1] * len(comp), reward=float(m % 2)))
        groups.append(group)
    return groups


class RssStages:
    """Peak resident memory per stage of a rank (load, parallelize, each step, ...), sampled every
    few milliseconds by a thread; a stage lasts until the next one starts."""

    def __init__(self, interval_s: float = 0.005) -> None:
        import threading

        self.peaks_gb: dict[str, float] = {}
        self._name = "start"
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
        self._thread.start()

    def _rss_gb(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page / 2**30

    def _sample(self, interval_s: float) -> None:
        while not self._done.wait(interval_s):
            gb = self._rss_gb()
            if gb > self.peaks_gb.get(self._name, 0.0):
                self.peaks_gb[self._name] = round(gb, 3)

    def stage(self, name: str) -> None:
        self._name = name

    def close(self) -> None:
        self._done.set()
        self._thread.join(1)


def _state_bytes(policy, optimizer) -> int:
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = sum(local(p).numel() * local(p).element_size() for p in policy.parameters())
    optim = sum(
        local(v).numel() * local(v).element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if hasattr(v, "numel") and v.dim() > 0
    )
    return 2 * params + optim  # parameters, their gradients, AdamW's two moments


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from vriksha.errors import ConfigError
    from vriksha.profiling import ProfileConfig, StepProfiler
    from vriksha.train.config import GRPOConfig
    from vriksha.train.distributed import init_distributed, shard_range, shutdown_distributed
    from vriksha.train.grpo import group_advantages
    from vriksha.train.losses import build_loss
    from vriksha.train.parallelize import check_tp_degree, parallelize
    from vriksha.train.update import Learner, UpdateBatch, policy_update

    d, t = (int(x) for x in args.worker.split("x"))
    out = Path(args.out) / args.worker
    rss = RssStages()
    dims = init_distributed(dp_shard=d, tp=t)
    row: dict = {"mesh": args.worker, "rank": dims.rank}
    try:
        rss.stage("load")
        model = _model(args.model)
        check_tp_degree(model.config, t)
    except ConfigError as exc:
        row["skipped"] = str(exc)
        (out / f"rank{dims.rank}.json").write_text(json.dumps(row))
        shutdown_distributed()
        return
    rss.stage("parallelize")
    policy = parallelize(model.to(dims.device), dims, shard_vocab=not args.replicate_vocab)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    groups = _episodes(args, model.config.vocab_size)
    mine = [groups[i] for i in shard_range(len(groups), dims.dp_rank, dims.dp, "--groups")]
    adv = group_advantages(torch.tensor([[e.reward for e in g] for g in mine])).advantages.tolist()
    cfg = GRPOConfig(micro_batch_groups=args.micro_batch_groups)
    learner = Learner(policy, opt, build_loss(cfg), cfg, dims.device, max_grad_norm=1.0, dims=dims)

    def update() -> None:
        dist.barrier()
        policy_update(learner, UpdateBatch(mine, adv, mine[0], pad_id=0))
        if dims.device.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for step in range(args.warmup + args.steps):  # timed and measured without the profiler
        rss.stage(f"step{step}")
        t0 = time.perf_counter()
        update()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the high-water mark so far
    if args.profile:
        # the shares come from separate steps: the profiler holds a step's events until its export
        # (about 2 GiB a rank for one step of the embedded model on 2x1), so it would inflate the
        # memory and the time it measures
        rss.stage("profiled steps")
        prof = StepProfiler(
            ProfileConfig(enabled=True, dir=out / "traces", wait=0, warmup=1, active=args.profile_steps),
            rank=dims.rank,
            name=f"parallel_{args.worker}",
        )
        prof.start()
        for _ in range(1 + args.profile_steps):
            update()
            prof.step()
        prof.stop()
    rss.close()
    row.update(
        rss_stage_gb=rss.peaks_gb,
        step_s=statistics.median(times),
        step_s_all=times,
        peak_rss_gb=peak,
        state_mb=_state_bytes(policy, opt) / 2**20,
        world=dims.world_size,
    )
    if dims.device.type == "cuda":
        row["cuda_peak_gb"] = torch.cuda.max_memory_allocated(dims.device) / 2**30
    (out / f"rank{dims.rank}.json").write_text(json.dumps(row))
    shutdown_distributed()


# ---------------------------------------------------------------- trace shares


def _shares(analysis) -> dict[str, float]:
    """Share of the steps' wall time (all ranks) in collectives and in DTensor dispatch: the self
    time of those operators in `vriksha profile report`'s operator table."""
    wall = analysis.wall_us or 1.0

    def share(match) -> float:
        return sum(o.self_us for o in analysis.ops if match(o.name)) / wall

    return {
        "comm_share": share(lambda n: any(m in n.lower() for m in COMM_MARKS)),
        "dtensor_dispatch_share": share(lambda n: n in DTENSOR_OPS),
    }


# ---------------------------------------------------------------- driver


def run_mesh(args: argparse.Namespace, mesh: str, argv: list[str]) -> dict:
    d, t = (int(x) for x in mesh.split("x"))
    world = d * t
    out = Path(args.out) / mesh
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.reanalyze:
        for old in [*out.glob("rank*.json"), *out.glob("traces/*")]:
            old.unlink()
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               __file__, *argv, "--worker", mesh]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            return {"mesh": mesh, "error": proc.stderr[-2000:]}
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    if not ranks:
        return {"mesh": mesh, "error": f"no results under {out}"}
    if ranks and "skipped" in ranks[0]:
        return {"mesh": mesh, "skipped": ranks[0]["skipped"]}
    row = {
        "mesh": mesh,
        "world": world,
        "step_s": ranks[0]["step_s"],
        "peak_rss_gb": [r["peak_rss_gb"] for r in ranks],
        "state_mb": [r["state_mb"] for r in ranks],
        "rss_stage_gb": [r.get("rss_stage_gb", {}) for r in ranks],
        "wall_s": time.perf_counter() - t0,
    }
    if "cuda_peak_gb" in ranks[0]:
        row["cuda_peak_gb"] = [r["cuda_peak_gb"] for r in ranks]
    traces = sorted((out / "traces").glob("*.json*"))
    if traces:
        from vriksha.profiling.report import build, format_report

        analysis = build(traces)
        (out / "report.txt").write_text(format_report(analysis) + "\n")
        row.update(_shares(analysis))
        row["report"] = str(out / "report.txt")
    return row


def _table(rows: list[dict], args: argparse.Namespace) -> str:
    head = (f"model {args.model}, {args.groups} x {args.group_size} completions of {args.completion_len} "
            f"tokens after {args.prompt_len}-token prompts, median of {args.steps} update steps")  # fmt: skip
    lines = [head, "", "| mesh (dp x tp) | step s | vs 1x1 | state MiB / rank | peak RSS GiB / rank | comm | DTensor dispatch |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    base = next((r["step_s"] for r in rows if r["mesh"] == "1x1" and "step_s" in r), None)
    for r in rows:
        if "step_s" not in r:
            lines.append(f"| {r['mesh']} | {r.get('skipped') or 'failed (see json)'} | | | | | |")
            continue
        ratio = f"{r['step_s'] / base:.2f}x" if base else ""
        comm = f"{100 * r['comm_share']:.0f}%" if "comm_share" in r else ""
        disp = f"{100 * r['dtensor_dispatch_share']:.0f}%" if "dtensor_dispatch_share" in r else ""
        lines.append(
            f"| {r['mesh']} | {r['step_s']:.3f} | {ratio} | {max(r['state_mb']):.1f} | "
            f"{max(r['peak_rss_gb']):.2f} | {comm} | {disp} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    meshes = (args.meshes or ("1x1,2x1,1x3,2x3" if args.model == "embedded" else "1x1,2x1,1x2,2x2")).split(
        ","
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mesh in meshes:
        print(f"mesh {mesh} ...", flush=True)
        rows.append(run_mesh(args, mesh.strip(), argv))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "error"}), flush=True)
        if "error" in rows[-1]:
            print(rows[-1]["error"], file=sys.stderr)
    table = _table(rows, args)
    (out / "parallel_cost.json").write_text(json.dumps(rows, indent=2))
    (out / "parallel_cost.md").write_text(table + "\n")
    print(table)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
