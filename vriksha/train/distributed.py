"""One DeviceMesh for every run: FSDP2 over `dp_shard` ranks, gloo on CPU and NCCL on GPU.

`torchrun --nproc_per_node=N` sets RANK/WORLD_SIZE and the rendezvous; a plain single process
gets a process group of one over an in-memory store, so it runs the very same code path.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ParallelDims", "init_distributed", "parallelize", "shard_range", "EngineWeights", "all_reduce"]


@dataclass(slots=True)
class ParallelDims:
    """Where this process sits: rank, world size, device, backend and the mesh over them."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    mesh: DeviceMesh

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | None = None) -> ParallelDims:
    """Join (or create) the process group and build a 1-D mesh named `dp_shard`."""
    want_cuda = device.startswith("cuda") if device else torch.cuda.is_available()
    backend = "nccl" if want_cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if want_cuda:
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, device_id=dev if want_cuda else None)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp_shard",))
    logger.info("rank %d/%d on %s (%s)", rank, world, dev, backend)
    return ParallelDims(rank, world, local_rank, dev, backend, mesh)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: modules of a class Transformers says must not be split."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        layers = getattr(getattr(model, "model", None), "layers", None)
        blocks = list(layers) if layers is not None else []
    return blocks


def parallelize(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None = None) -> nn.Module:
    """`fully_shard` each transformer block, then the root (embeddings, final norm, head).

    FSDP averages gradients over ranks; the loss is normalised by the global token count, so the
    caller scales each rank's loss by the world size (see `update.py`) to get the summed, i.e. the
    single-process, gradient. (A divide factor of 1 would say the same, but gloo has no PREMUL_SUM.)
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    # one rank: keep the gathered parameters from forward to backward (nothing to save by freeing
    # them, and the prompt and completion forwards of a micro-batch then gather only once)
    kwargs = {"mesh": mesh, "reshard_after_forward": mesh.size() > 1, **({"mp_policy": mp} if mp else {})}
    for block in _blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def shard_range(total: int, rank: int, world_size: int, what: str = "rollout.prompts_per_step") -> range:
    """This rank's contiguous slice of `total` items (prompts); `total` must divide evenly."""
    if total % world_size:
        raise ConfigError(f"{what}: {total} does not split evenly over {world_size} processes")
    per = total // world_size
    return range(rank * per, (rank + 1) * per)


def all_reduce(values: list[float], op: str = "sum", device: torch.device | None = None) -> list[float]:
    """All-reduce a list of floats (float64) across ranks; a no-op in a group of one."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    dev = device if device is not None and dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


class EngineWeights:
    """Keeps a plain (unsharded) module that the engine reads in step with the sharded policy.

    With one rank, the shard *is* the whole tensor: the engine module's parameters alias the
    policy's storage once, and the optimizer's in-place updates are seen with no copy at all.
    With several ranks, `sync()` all-gathers each parameter into the engine module in place.
    """

    def __init__(self, policy: nn.Module, engine_module: nn.Module, world_size: int) -> None:
        self.policy = policy
        self.engine_module = engine_module
        self.world_size = world_size
        self._pairs = self._match()
        self.aliased = False
        if world_size == 1:
            self._alias()

    def _match(self) -> list[tuple[str, nn.Parameter, nn.Parameter]]:
        target = dict(self.engine_module.named_parameters())
        pairs = []
        for name, p in self.policy.named_parameters():
            if name not in target:
                raise RuntimeError(f"engine module has no parameter {name!r}")
            pairs.append((name, p, target[name]))
        return pairs

    def _alias(self) -> None:
        for _, p, q in self._pairs:
            local = p.to_local() if isinstance(p, DTensor) else p.data
            if local.shape != q.shape or local.dtype != q.dtype or local.device != q.device:
                return  # not the same layout (mixed precision, padding): fall back to copies
        for _, p, q in self._pairs:
            q.data = p.to_local() if isinstance(p, DTensor) else p.data
        self.aliased = True

    @torch.no_grad()
    def sync(self) -> None:
        """Bring the engine module's weights up to date with the policy (a collective when sharded)."""
        if self.aliased:
            # a checkpoint load may have given the policy new storage: re-alias if so
            _, p, q = self._pairs[0]
            local = p.to_local() if isinstance(p, DTensor) else p.data
            if local.data_ptr() == q.data_ptr():
                return
            self._alias()
            if self.aliased:
                return
        for _, p, q in self._pairs:
            full = p.full_tensor() if isinstance(p, DTensor) else p.data
            q.data.copy_(full)
