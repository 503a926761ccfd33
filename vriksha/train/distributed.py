"""One DeviceMesh for every run: `(dp_replicate, dp_shard, tp)`, gloo on CPU and NCCL on GPU.

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
from torch.distributed.tensor import DTensor

import vriksha.device as devices
from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "ParallelDims",
    "init_distributed",
    "resolve_degrees",
    "shard_range",
    "EngineWeights",
    "all_reduce",
    "all_gather_floats",
]


@dataclass(slots=True)
class ParallelDims:
    """Where this process sits on the mesh `(dp_replicate, dp_shard, tp)`, tp innermost.

    `dp_replicate x dp_shard` ranks hold different data (HSDP when `dp_replicate > 1`, FSDP2
    over `dp_shard`); the `tp` ranks of one data-parallel group hold the same batch and split
    every matmul (attention heads, MLP columns) between them. World rank
    `r = (replicate * dp_shard + shard) * tp + t`, so a tensor-parallel group is `tp` consecutive
    ranks (one host's devices on a GPU cluster).
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    mesh: DeviceMesh
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different batches one step trains on."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The mesh FSDP2 shards (and, with `dp_replicate > 1`, replicates) over."""
        return self.mesh["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else self.mesh["dp_shard"]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def shape(self) -> str:
        """`dp x tp` as the docs and the benchmark write it (`2x2`), with the replicate degree first if any."""
        dp = f"{self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else str(self.dp_shard)
        return f"{dp}x{self.tp}"


def resolve_degrees(
    world_size: int, dp_replicate: int = 1, dp_shard: int = -1, tp: int = 1
) -> tuple[int, int, int]:
    """Check the degrees against the world size; `dp_shard=-1` takes the ranks the others leave."""
    for name, value in (("dp_replicate", dp_replicate), ("tp", tp)):
        if value < 1:
            raise ConfigError(f"parallel.{name}: must be >= 1, got {value}")
    if dp_shard == 0 or dp_shard < -1:
        raise ConfigError(f"parallel.dp_shard: must be >= 1 or -1 (the remaining ranks), got {dp_shard}")
    if dp_shard == -1:
        rest = dp_replicate * tp
        if world_size % rest:
            raise ConfigError(
                f"parallel: dp_replicate ({dp_replicate}) x tp ({tp}) = {rest} does not divide the "
                f"world size {world_size}; choose degrees whose product divides the number of processes"
            )
        dp_shard = world_size // rest
    product = dp_replicate * dp_shard * tp
    if product != world_size:
        raise ConfigError(
            f"parallel: dp_replicate ({dp_replicate}) x dp_shard ({dp_shard}) x tp ({tp}) = {product}, "
            f"but the world size is {world_size}; the product must equal the number of processes "
            "(--nproc, or torchrun --nproc_per_node); dp_shard: -1 takes whatever is left"
        )
    return dp_replicate, dp_shard, tp


def init_distributed(
    device: str | None = None, dp_replicate: int = 1, dp_shard: int = -1, tp: int = 1
) -> ParallelDims:
    """Join (or create) the process group and build the mesh `(dp_replicate, dp_shard, tp)`.

    The defaults put every rank on `dp_shard` (plain FSDP2), as a 1-D mesh would.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = devices.local_device(local_rank, device)
    backend = devices.collective_backend(dev)
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, device_id=None if devices.is_host(dev) else dev)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    rep, shard, tp = resolve_degrees(world, dp_replicate, dp_shard, tp)
    mesh = init_device_mesh(dev.type, (rep, shard, tp), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    logger.info(
        "rank %d/%d on %s (%s), mesh dp_replicate=%d dp_shard=%d tp=%d",
        rank,
        world,
        dev,
        backend,
        rep,
        shard,
        tp,
    )
    return ParallelDims(rank, world, local_rank, dev, backend, mesh, rep, shard, tp)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


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
    dev = devices.collective_device(device) if device is not None else devices.host()
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def all_gather_floats(values: list[float], device: torch.device | None = None) -> list[list[float]]:
    """Every rank's list of floats (float64; as long on every rank), in rank order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [list(values)]
    dev = devices.collective_device(device) if device is not None else devices.host()
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [x.tolist() for x in out]


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

    def full_tensors(self) -> list[torch.Tensor]:
        """The policy's full tensors, up to date, in the engine module's parameter order (`sync` first)."""
        self.sync()
        return [p.data for p in self.engine_module.parameters()]
