"""The collectives of a tensor-parallel engine: one process group over its N ranks.

gloo on the CPU; on an accelerator its own backend (NCCL on CUDA) for the activations' all-reduces, with gloo
beside it for the step messages, which are host tensors. The group is the process's default one, so an
engine with `tensor_parallel_size > 1` needs a process that has none yet (a server, a script; not a trainer
rank, whose engine serves on one rank).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

import vriksha.device as devices
from vriksha.engine.tensor_parallel.step import HEADER, StepMessage, payload_size
from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)


def backend_for(device: torch.device) -> str:
    """gloo for the host; on an accelerator its backend for device tensors and gloo for host ones."""
    backend = devices.collective_backend(device)
    if devices.is_host(device):
        return backend
    return f"{devices.HOST_TYPE}:gloo,{device.type}:{backend}"


def check_no_group() -> None:
    if dist.is_initialized():
        raise ConfigError(
            "tensor-parallel serving runs its ranks in a process group of their own, and this process "
            "already belongs to one; build the engine in a process without torch.distributed "
            "(or serve on one rank: tensor_parallel_size=1)"
        )


class Collectives:
    """This rank's view of the group; `on_error` turns a failed collective into the engine's error."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        device: torch.device,
        timeout_s: float,
        on_error: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        check_no_group()
        dist.init_process_group(
            backend_for(device),
            store=dist.PrefixStore("tp", store),
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self.rank, self.size, self.device = rank, size, device
        self.on_error = on_error or (lambda exc: exc)
        self.closed = False

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except RuntimeError as exc:  # a lost peer (DistBackendError is a RuntimeError)
            raise self.on_error(exc) from exc

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the ranks, in place (the row-parallel linears' partial outputs)."""
        self._run(lambda: dist.all_reduce(tensor))

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        self._run(lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN))
        return int(t)

    def send(self, message: StepMessage) -> None:
        """Rank 0: broadcast a step (its header, then its payload)."""
        self._run(lambda: dist.broadcast(message.header, 0))
        if message.payload.numel():
            self._run(lambda: dist.broadcast(message.payload.to(devices.host()), 0))

    def receive(self) -> StepMessage:
        """The other ranks: the next step rank 0 broadcasts."""
        header = torch.zeros(HEADER, dtype=torch.int64)
        self._run(lambda: dist.broadcast(header, 0))
        payload = torch.empty(payload_size(header), dtype=torch.int64)
        if payload.numel():
            self._run(lambda: dist.broadcast(payload, 0))
        return StepMessage(header, payload)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a group whose peers died may not tear down cleanly
                logger.debug("destroying the tensor-parallel process group failed", exc_info=True)
