"""Log-probabilities and entropy on logits split over the vocabulary (tensor-parallel LM head).

Each rank holds the logits of a contiguous slice of the vocabulary. The log-softmax needs only the
global max, the global sum of exponentials and the target's logit: three all-reduces of one value
per token, instead of gathering `[tokens, vocab]` onto every rank. The backward is local: the
gradient of `log p(target)` with respect to a logit is `1[target] - p`, and `p` needs only the
saved global normaliser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard

__all__ = ["VocabShard", "local_logits", "sharded_token_logprobs"]


@dataclass(slots=True, frozen=True)
class VocabShard:
    """This rank's slice `[offset, offset + local size)` of a vocabulary of `vocab_size` ids."""

    offset: int
    vocab_size: int
    group: dist.ProcessGroup


def local_logits(logits: Tensor) -> tuple[Tensor, VocabShard | None]:
    """The plain tensor to compute with, and the vocabulary slice if the logits are sharded on it.

    `to_local()` keeps autograd: the gradient flows back into the DTensor as a shard again.
    """
    if not isinstance(logits, DTensor):
        return logits, None
    (placement,) = logits.placements
    if not isinstance(placement, Shard) or placement.dim not in (-1, logits.ndim - 1):
        return logits.full_tensor(), None
    mesh = logits.device_mesh
    vocab, n = logits.shape[-1], mesh.size()
    chunk = -(-vocab // n)  # DTensor shards like torch.chunk: ceil(V / n) per rank, the last shorter
    offset = min(mesh.get_local_rank() * chunk, vocab)
    return logits.to_local(), VocabShard(offset, vocab, mesh.get_group())


class _ShardedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: Tensor, targets: Tensor, offset: int, group: dist.ProcessGroup) -> Tensor:
        with torch.no_grad():
            top = local.amax(-1)
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            shifted = local - top.unsqueeze(-1)
            norm = shifted.exp().sum(-1)
            dist.all_reduce(norm, group=group)
            log_norm = norm.log()
            idx = targets - offset
            inside = (idx >= 0) & (idx < local.shape[-1])
            idx = idx.clamp(0, local.shape[-1] - 1)
            picked = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * inside
            dist.all_reduce(picked, group=group)
        ctx.save_for_backward(shifted, log_norm, idx, inside)
        return picked - log_norm

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        shifted, log_norm, idx, inside = ctx.saved_tensors
        probs = (shifted - log_norm.unsqueeze(-1)).exp()
        out = probs.mul_(-grad.unsqueeze(-1))
        out.scatter_add_(-1, idx.unsqueeze(-1), (grad * inside).unsqueeze(-1))
        return out, None, None, None


def sharded_token_logprobs(
    local: Tensor, targets: Tensor, shard: VocabShard, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """`log p(targets)` (and the entropy, without gradient) from this rank's slice of the logits."""
    local = local.float()
    lp = _ShardedLogprob.apply(local, targets, shard.offset, shard.group)
    ent = None
    if with_entropy:
        with torch.no_grad():
            top = local.amax(-1)
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=shard.group)
            shifted = local - top.unsqueeze(-1)
            exp = shifted.exp()
            sums = torch.stack([exp.sum(-1), (exp * shifted).sum(-1)])
            dist.all_reduce(sums, group=shard.group)
            ent = sums[0].log() - sums[1] / sums[0]
    return lp, ent
