"""One policy update: micro-batched forward/backward of the GRPO loss over this rank's groups.

Every rank runs the same number of micro-batches (FSDP's collectives must line up): a rank with
fewer groups runs its first group again with zero weight. With `epochs_per_batch > 1`, the
old-policy log-probs are the detached log-probs of the first epoch (the parameters have not moved
yet), so pi_old never costs a forward of its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from vriksha.profiling import phase
from vriksha.train.batch import GroupBatch, collate_groups
from vriksha.train.config import GRPOConfig
from vriksha.train.distributed import ParallelDims, all_reduce
from vriksha.train.grpo import LossStats, grpo_token_loss
from vriksha.train.logprobs import completion_logprobs
from vriksha.train.precision import TrainPrecision
from vriksha.train.rollout import Episode

__all__ = ["UpdateResult", "policy_update"]


@dataclass(slots=True)
class UpdateResult:
    loss: float = 0.0  # local contribution to the global loss (sum over ranks = the loss)
    stats: LossStats = field(default_factory=LossStats)
    entropy_sum: float = 0.0
    grad_norm: float = 0.0
    optimizer_steps: int = 0


def _micro_batches(
    groups: Sequence[Sequence[Episode]], advantages: Sequence[Sequence[float]], size: int, pad_id: int
) -> list[GroupBatch]:
    return [
        collate_groups(groups[i : i + size], advantages[i : i + size], pad_id)
        for i in range(0, len(groups), size)
    ]


def _clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """The global gradient norm (and clipping to it) over parameters that may live on different
    meshes: with tensor parallel the split weights are DTensors on `(dp_shard, tp)`, the
    replicated ones (norms) on `dp_shard` alone. Norms are taken per mesh and combined."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in params:
        by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p.grad)
    squares = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.double() ** 2)
    total = float(torch.stack(squares).sum().sqrt())
    coef = 1.0 if max_norm is None else min(1.0, max_norm / (total + 1e-6))  # as clip_grad_norm_
    if coef < 1.0:
        for p in params:
            p.grad.mul_(coef)
    return total


def policy_update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    groups: Sequence[Sequence[Episode]],
    advantages: Sequence[Sequence[float]],
    filler: Sequence[Episode],
    cfg: GRPOConfig,
    max_grad_norm: float | None,
    pad_id: int,
    device: torch.device,
    ref_model: nn.Module | None = None,
    dims: ParallelDims | None = None,
    precision: TrainPrecision | None = None,
) -> UpdateResult:
    """`groups`: this data-parallel rank's groups that carry signal, `filler`: any one group of
    this rank (for zero-weight micro-batches). Returns the local sums; the caller reduces them.

    With tensor parallel (`dims.tp > 1`) the `tp` ranks of a data-parallel group get the same
    groups; only the first of them counts tokens and reports sums, so that sums over all ranks
    stay the global ones."""
    result = UpdateResult()

    def autocast():
        return precision.autocast(device) if precision is not None else contextlib.nullcontext()

    dp = dims.dp if dims is not None else (dist.get_world_size() if dist.is_initialized() else 1)
    reports = dims is None or dims.tp_rank == 0
    local_tokens = float(sum(sum(e.loss_mask) for g in groups for e in g)) if reports else 0.0
    global_tokens = all_reduce([local_tokens], op="sum", device=device)[0]
    local_micro = float(math.ceil(len(groups) / cfg.micro_batch_groups))
    n_micro = int(all_reduce([local_micro], op="max", device=device)[0])
    if global_tokens == 0:
        return result
    batches = [b.to(device) for b in _micro_batches(groups, advantages, cfg.micro_batch_groups, pad_id)]
    filler_batch = None
    if len(batches) < n_micro:
        filler_batch = collate_groups([filler], [[0.0] * len(filler)], pad_id).to(device)
    old: list[torch.Tensor] = []
    refs: list[torch.Tensor | None] = []
    agree = None
    if dist.is_initialized() and dist.get_world_size() > 1:  # every rank runs as many completion forwards

        def agree(count: int) -> int:
            return int(all_reduce([float(count)], op="max", device=device)[0])

    logprob_options = dict(
        chunk_tokens=cfg.logprob_chunk_tokens, overhead_tokens=cfg.logprob_split_overhead_tokens, agree=agree
    )
    for epoch in range(cfg.epochs_per_batch):
        for i in range(n_micro):
            real = i < len(batches)
            batch = batches[i] if real else filler_batch
            with phase("train.forward"), autocast():
                out = completion_logprobs(policy, batch, with_entropy=epoch == 0 and real, **logprob_options)
                if epoch == 0:
                    old.append(out.logprobs.detach())
                    ref = None
                    if ref_model is not None and cfg.kl_coef > 0:
                        with torch.no_grad():
                            ref = completion_logprobs(ref_model, batch, **logprob_options).logprobs
                    refs.append(ref)
                loss, stats = grpo_token_loss(
                    out.logprobs,
                    old[i],
                    batch.advantages,
                    batch.loss_mask,
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    num_tokens_global=global_tokens,
                    engine_logprobs=batch.engine_logprobs if cfg.importance_correction else None,
                    importance_cap=cfg.importance_cap,
                    ref_logprobs=refs[i],
                    kl_coef=cfg.kl_coef,
                )
                if not real:
                    loss = loss * 0.0
            with phase("train.backward"):
                # FSDP averages gradients over data-parallel ranks; scaling by their number makes it the sum
                (loss * dp).backward()
            if real and epoch == 0 and reports:
                result.loss += float(loss.detach())
                result.stats.add(stats)
                if out.entropy is not None:
                    result.entropy_sum += float((out.entropy * batch.loss_mask).sum())
        with phase("train.optimizer"):
            result.grad_norm = _clip_grad_norm(policy, max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        result.optimizer_steps += 1
    return result
