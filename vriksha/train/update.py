"""One policy update: micro-batched forward/backward of the GRPO loss over this rank's groups.

Every rank runs the same number of micro-batches (FSDP's collectives must line up): a rank with
fewer groups runs its first group again with zero weight. With `epochs_per_batch > 1`, the
old-policy log-probs are the detached log-probs of the first epoch (the parameters have not moved
yet), so pi_old never costs a forward of its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from vriksha.envs.play import Episode
from vriksha.profiling import phase
from vriksha.train.batch import GroupBatch, collate_groups
from vriksha.train.config import GRPOConfig
from vriksha.train.distributed import ParallelDims, all_reduce
from vriksha.train.lockstep import lockstep_logprobs
from vriksha.train.logprobs import completion_logprobs
from vriksha.train.losses import Loss, LossInputs
from vriksha.train.precision import TrainPrecision

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["Learner", "UpdateBatch", "UpdateResult", "policy_update"]


@dataclass(slots=True)
class Learner:
    """What an update changes and how: the policy and its optimizer, the loss, the `grpo` options
    (micro-batches, epochs, log-prob chunks), the frozen reference (the loss gets its log-probs when
    one is given), the gradient clip, and where this process sits."""

    policy: PreTrainedModel  # sharded in place (FSDP2, tensor parallel) or not
    optimizer: torch.optim.Optimizer
    loss: Loss
    cfg: GRPOConfig
    device: torch.device
    max_grad_norm: float | None = None
    ref_model: PreTrainedModel | None = None
    dims: ParallelDims | None = None
    precision: TrainPrecision | None = None
    # on-policy distillation: a local teacher model (run like the reference) or a scorer of micro-batches
    teacher: nn.Module | Callable[[GroupBatch], torch.Tensor] | None = None


@dataclass(slots=True)
class UpdateBatch:
    """This data-parallel rank's groups that carry signal with their advantages, and any one group of
    this rank (the `filler` of zero-weight micro-batches, run where other ranks have more)."""

    groups: Sequence[Sequence[Episode]]
    advantages: Sequence[Sequence[float]]
    filler: Sequence[Episode]
    pad_id: int


@dataclass(slots=True)
class UpdateResult:
    """This rank's sums (the sums over ranks are the step's): the loss, the generated tokens and the
    loss's metrics summed over them, and the entropy; the gradient norm and the optimizer steps."""

    loss: float = 0.0
    tokens: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
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
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    squares = []
    for on_mesh in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(on_mesh, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.double() ** 2)
    total = float(torch.stack(squares).sum().sqrt())
    coef = 1.0 if max_norm is None else min(1.0, max_norm / (total + 1e-6))  # as clip_grad_norm_
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total


def policy_update(learner: Learner, batch: UpdateBatch) -> UpdateResult:
    """Train on `batch` for `grpo.epochs_per_batch` optimizer steps; returns the local sums, which the
    caller reduces.

    With tensor parallel (`dims.tp > 1`) the `tp` ranks of a data-parallel group get the same
    groups; only the first of them counts tokens and reports sums, so that sums over all ranks
    stay the global ones."""
    result = UpdateResult(metrics=dict.fromkeys(learner.loss.metric_names, 0.0))
    cfg, dims, device = learner.cfg, learner.dims, learner.device
    groups = batch.groups
    dp = dims.dp if dims is not None else (dist.get_world_size() if dist.is_initialized() else 1)
    reports = dims is None or dims.tp_rank == 0
    local_tokens = float(sum(sum(e.loss_mask) for g in groups for e in g)) if reports else 0.0
    local_sequences = float(sum(len(g) for g in groups)) if reports else 0.0
    local_micro = float(math.ceil(len(groups) / cfg.micro_batch_groups))
    global_tokens, global_sequences, global_micro = all_reduce(
        [local_tokens, local_sequences, local_micro if reports else 0.0], op="sum", device=device
    )
    n_micro = int(all_reduce([local_micro], op="max", device=device)[0])
    if global_tokens == 0:
        return result
    size, pad_id = cfg.micro_batch_groups, batch.pad_id
    batches = [b.to(device) for b in _micro_batches(groups, batch.advantages, size, pad_id)]
    n_real = len(batches)
    if n_real < n_micro:  # zero-weight micro-batches: as many forwards as the busiest rank runs
        filler = collate_groups([batch.filler], [[0.0] * len(batch.filler)], pad_id).to(device)
        batches += [filler] * (n_micro - n_real)
    # exact on-policy: the engine's lockstep calls again, so pi_old is the sampling log-prob bit for bit
    policy_logprobs = lockstep_logprobs if cfg.on_policy == "exact" else completion_logprobs
    old: list[torch.Tensor] = []
    refs: list[torch.Tensor | None] = []
    teachers: list[torch.Tensor | None] = []
    options = _logprob_options(cfg, device)
    entropy_grad = learner.loss.needs_entropy
    for epoch in range(cfg.epochs_per_batch):
        for i, mb in enumerate(batches):
            counts = i < n_real
            with phase("train.forward"), _autocast(learner.precision, device):
                with_entropy = entropy_grad or (epoch == 0 and counts)
                out = policy_logprobs(learner.policy, mb, with_entropy, entropy_grad=entropy_grad, **options)
                if epoch == 0:
                    old.append(out.logprobs.detach())
                    refs.append(None)
                    if learner.ref_model is not None:
                        with torch.no_grad():
                            refs[i] = completion_logprobs(learner.ref_model, mb, False, **options).logprobs
                    teachers.append(None)
                    if learner.teacher is not None:
                        with torch.no_grad():
                            if isinstance(learner.teacher, nn.Module):
                                teacher = cast("PreTrainedModel", learner.teacher)
                                teachers[i] = completion_logprobs(teacher, mb, False, **options).logprobs
                            else:
                                teachers[i] = learner.teacher(mb)
                scored = learner.loss(
                    LossInputs(
                        logprobs=out.logprobs,
                        old_logprobs=old[i],
                        advantages=mb.advantages,
                        loss_mask=mb.loss_mask,
                        sampling_logprobs=mb.engine_logprobs,
                        ref_logprobs=refs[i],
                        entropy=out.entropy if entropy_grad else None,
                        teacher_logprobs=teachers[i],
                        num_tokens_global=global_tokens,
                        num_sequences_global=global_sequences,
                        num_micro_batches_global=global_micro,
                    )
                )
                loss = scored.loss if counts else scored.loss * 0.0
            with phase("train.backward"):
                # FSDP averages gradients over data-parallel ranks; scaling by their number makes it the sum
                (loss * dp).backward()
            if counts and epoch == 0 and reports:
                result.loss += float(loss.detach())
                result.tokens += scored.tokens
                for name, value in scored.metrics.items():
                    result.metrics[name] = result.metrics.get(name, 0.0) + value
                if out.entropy is not None:
                    result.entropy_sum += float((out.entropy.detach() * mb.loss_mask).sum())
        with phase("train.optimizer"):
            result.grad_norm = _clip_grad_norm(learner.policy, learner.max_grad_norm)
            learner.optimizer.step()
            learner.optimizer.zero_grad(set_to_none=True)
        result.optimizer_steps += 1
    return result


class _LogprobOptions(TypedDict):
    chunk_tokens: int | None
    overhead_tokens: int
    agree: Callable[[int], int] | None


def _autocast(
    precision: TrainPrecision | None, device: torch.device
) -> contextlib.AbstractContextManager[None]:
    return precision.autocast(device) if precision is not None else contextlib.nullcontext()


def _logprob_options(cfg: GRPOConfig, device: torch.device) -> _LogprobOptions:
    def agree(count: int) -> int:
        return int(all_reduce([float(count)], op="max", device=device)[0])

    many = dist.is_initialized() and dist.get_world_size() > 1  # every rank runs as many completion forwards
    return {
        "chunk_tokens": cfg.logprob_chunk_tokens,
        "overhead_tokens": cfg.logprob_split_overhead_tokens,
        "agree": agree if many else None,
    }
