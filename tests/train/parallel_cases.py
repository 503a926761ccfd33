"""Worker side of the mesh tests: GRPO updates of a tiny Llama on fixed episodes, on any mesh.

`run_world(world, cases, out_dir)` starts `world` gloo processes; each case builds its mesh
(`dp_shard x tp`) in the same process group, trains `steps` updates on the same four groups
(each data-parallel rank takes its share) and rank 0 saves, per step, the global loss, the
gradient norm, every full gradient and every full parameter after the step to `<name>.pt`.
A case can save a checkpoint after a step, or start from one written on another mesh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from vriksha.net.launch import free_port

VOCAB = 101  # odd: a vocabulary split over 2 or 4 ranks is uneven (51 + 50, 26 x 3 + 23)


@dataclass(frozen=True)
class Case:
    name: str
    dp_shard: int
    tp: int
    steps: int = 2
    save_after: int | None = None  # write a checkpoint (under out_dir/<name>.ckpt) after this step
    resume_from: str | None = None  # the name of a case whose checkpoint to start from
    shard_vocab: bool = True
    family: str = "llama"  # "qwen3": per-head q/k norms and a tied embedding / LM head
    chunk_tokens: int = 0  # LM-head chunk of the log-probs (0: all at once; 3: one position per chunk)
    split_overhead: int = 64  # the completions' sub-batches by length (0: each length its own forward)
    uneven: bool = False  # group 0: one completion length (one forward planned, three elsewhere)


def tiny_model(family: str = "llama"):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        family,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        tie_word_embeddings=family == "qwen3",
    )
    return AutoModelForCausalLM.from_config(config).eval()


def episodes(uneven: bool = False) -> list[list]:
    """Four groups of three completions of different lengths, prompts of different lengths; `uneven`:
    group 0's completions all of one length."""
    from vriksha.train.rollout import Episode

    g = torch.Generator().manual_seed(7)
    groups = []
    for gi in range(4):
        prompt = torch.randint(1, VOCAB, (3 + gi,), generator=g).tolist()
        group = []
        for m in range(3):
            n = 3 if uneven and gi == 0 else 2 + (gi + m) % 3
            comp = torch.randint(1, VOCAB, (n,), generator=g).tolist()
            mask = [1] * n
            if n > 2:
                mask[1] = 0  # an environment token inside the completion
            lps = (-torch.rand(n, generator=g) * 3).tolist()
            group.append(Episode(gi, m, gi, prompt, comp, lps, mask, reward=float((gi + m) % 3)))
        groups.append(group)
    return groups


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _run_case(case: Case, out_dir: Path) -> None:
    import torch.distributed as dist

    from vriksha.train.checkpoint import load_checkpoint, save_checkpoint
    from vriksha.train.config import GRPOConfig
    from vriksha.train.distributed import all_reduce, init_distributed, shard_range
    from vriksha.train.grpo import group_advantages
    from vriksha.train.losses import build_loss
    from vriksha.train.parallelize import parallelize
    from vriksha.train.update import Learner, UpdateBatch, policy_update

    dims = init_distributed(dp_shard=case.dp_shard, tp=case.tp)
    policy = parallelize(tiny_model(case.family), dims, shard_vocab=case.shard_vocab)
    # eps well above the rounding noise of near-zero gradients, which Adam would blow up to ~lr
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.01, eps=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    first = 1
    if case.resume_from is not None:
        state = load_checkpoint(out_dir / f"{case.resume_from}.ckpt", policy, opt, sched, dims.rank)
        first = int(state["step"]) + 1
    grads: list[dict[str, torch.Tensor]] = []
    opt.register_step_pre_hook(
        lambda *_: grads.append({n: _full(p.grad) for n, p in policy.named_parameters()})
    )
    groups = episodes(case.uneven)
    mine = [groups[i] for i in shard_range(len(groups), dims.dp_rank, dims.dp, "groups")]
    rewards = torch.tensor([[e.reward for e in g] for g in mine], dtype=torch.float64)
    adv = group_advantages(rewards).advantages.tolist()
    cfg = GRPOConfig(
        micro_batch_groups=1,
        kl_coef=0.0,
        logprob_chunk_tokens=case.chunk_tokens,
        logprob_split_overhead_tokens=case.split_overhead,
    )
    record: dict[str, list] = {"loss": [], "grad_norm": [], "grads": grads, "params": [], "steps": []}
    learner = Learner(policy, opt, build_loss(cfg), cfg, dims.device, max_grad_norm=1.0, dims=dims)
    for step in range(first, case.steps + 1):
        res = policy_update(learner, UpdateBatch(mine, adv, mine[0], pad_id=0))
        sched.step()
        record["steps"].append(step)
        record["loss"].append(all_reduce([res.loss])[0])
        record["grad_norm"].append(res.grad_norm)
        record["params"].append({n: _full(p) for n, p in policy.named_parameters()})
        if case.save_after == step:
            root = out_dir / f"{case.name}.run"
            path = save_checkpoint(root, step, policy, opt, sched, {"world_size": dims.world_size}, dims.rank)
            if dims.rank == 0:
                os.replace(path, out_dir / f"{case.name}.ckpt")
            dist.barrier()
    if dims.rank == 0:
        torch.save(record, out_dir / f"{case.name}.pt")
    dist.barrier()


def _worker(rank: int, world: int, port: int, cases: list[Case], out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    from vriksha.train.distributed import shutdown_distributed

    try:
        for case in cases:
            _run_case(case, Path(out_dir))
    finally:
        shutdown_distributed()


# what every worker imports, loaded once by the fork server: a fresh interpreter spends about 9 s of a Zen 1
# core importing them, so spawning 7 workers would cost a minute of CPU before the first step
PRELOAD = [
    "torch",
    "torch.distributed.checkpoint",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3.modeling_qwen3",
    "vriksha.train.update",
    "vriksha.train.checkpoint",
    "vriksha.train.parallelize",
    "tests.train.parallel_cases",
]


def run_world(world: int, cases: list[Case], out_dir: Path, timeout_s: float = 540) -> None:
    """Start `world` processes that run `cases` in order; raise if one fails or time runs out.

    They fork from a server process that imported `PRELOAD` and nothing else (no threads, no process
    group), so each begins as a fresh interpreter would, without the imports."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
    ctx = mp.start_processes(
        _worker,
        args=(world, free_port(), cases, str(out_dir)),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{world} processes did not finish {[c.name for c in cases]} in {timeout_s:.0f} s"
                )
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
