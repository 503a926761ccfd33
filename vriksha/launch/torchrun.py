"""Training ranks over torchrun (torchelastic): one host, or several nodes joined by a rendezvous.

    vriksha train CONFIG --nproc 2                                   # one node: torchrun --standalone
    vriksha train CONFIG --nnodes 2 --node-rank 0 --rdzv-endpoint HOST:29500 --nproc 4   # on node 0
    vriksha train CONFIG --nnodes 2 --node-rank 1 --rdzv-endpoint HOST:29500 --nproc 4   # on node 1
    srun --ntasks-per-node=1 vriksha train CONFIG --nproc 4          # Slurm: nodes and rendezvous from SLURM_*

`--nproc` counts processes per node; the world is `nnodes x nproc` ranks. `--standalone` (a private rendezvous
on a free local port) is used only for one node.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vriksha.errors import ConfigError
from vriksha.launch.slurm import from_slurm
from vriksha.launch.threads import threads_per_process

logger = logging.getLogger(__name__)

__all__ = ["TorchrunConfig", "torchrun_command", "run_torchrun", "strip_launch_flags"]

RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
DEFAULT_RDZV_PORT = 29500


def _opt(default: object, help: str, metavar: str | None = None) -> object:
    return field(default=default, metadata={"help": help, "metavar": metavar})


@dataclass(slots=True)
class TorchrunConfig:
    nproc: int = _opt(1, "training processes per node; more than one (or --nnodes > 1) runs through torchrun")
    nnodes: int = _opt(1, "nodes the training spans (run the same command on each, with its --node-rank)")
    node_rank: int | None = _opt(
        None, "this node's index, 0..nnodes-1 (with --rdzv-backend static; c10d assigns them itself)"
    )
    rdzv_endpoint: str | None = _opt(
        None, "HOST:PORT of the rendezvous every node reaches (node 0's address); needed with --nnodes > 1",
        "HOST:PORT",
    )  # fmt: skip
    rdzv_backend: str = _opt("c10d", f"torchrun's rendezvous backend ({', '.join(RDZV_BACKENDS)})")
    rdzv_id: str | None = _opt(None, "a job id the nodes share (default: from Slurm, else 'vriksha')")

    @property
    def distributed(self) -> bool:
        return self.nproc > 1 or self.nnodes > 1

    def validate(self) -> None:
        if self.nproc < 1:
            raise ConfigError(f"--nproc: must be >= 1, got {self.nproc}")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes: must be >= 1, got {self.nnodes}")
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise ConfigError(
                f"--rdzv-backend: {self.rdzv_backend!r} is not one of {', '.join(RDZV_BACKENDS)}"
            )
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank: must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes}")
        if self.nnodes > 1:
            if not self.rdzv_endpoint:
                raise ConfigError(
                    f"--nnodes {self.nnodes}: give --rdzv-endpoint HOST:PORT (an address of node 0 that every "
                    "node reaches), or run under Slurm's srun"
                )
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"--rdzv-endpoint: expected HOST:PORT, got {self.rdzv_endpoint!r}")
            if self.rdzv_backend == "static" and self.node_rank is None:
                raise ConfigError("--rdzv-backend static: give every node its --node-rank")

    def with_slurm(self, env: Mapping[str, str] | None = None) -> TorchrunConfig:
        """This config with what Slurm says (nodes, this node's index, the rendezvous) where it was not given;
        unchanged outside a Slurm step or where torchrun's own variables are set."""
        env = os.environ if env is None else env
        slurm = from_slurm(env)
        if slurm is None or "RANK" in env or self.nnodes > 1:
            return self
        endpoint = self.rdzv_endpoint or f"{slurm.head}:{env.get('MASTER_PORT', DEFAULT_RDZV_PORT)}"
        return replace(
            self,
            nnodes=slurm.nnodes,
            node_rank=slurm.node_rank if self.node_rank is None else self.node_rank,
            rdzv_endpoint=endpoint,
            rdzv_id=self.rdzv_id or slurm.job_id,
        )


def torchrun_command(cfg: TorchrunConfig, argv: list[str]) -> list[str]:
    """`torchrun ... -m vriksha.train ARGV`: standalone for one node, else the rendezvous of `cfg`."""
    exe = shutil.which("torchrun")
    cmd = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    if cfg.nnodes == 1:
        cmd += ["--standalone", f"--nproc_per_node={cfg.nproc}"]
    else:
        cmd += [
            f"--nnodes={cfg.nnodes}",
            f"--nproc_per_node={cfg.nproc}",
            f"--rdzv_backend={cfg.rdzv_backend}",
            f"--rdzv_endpoint={cfg.rdzv_endpoint}",
            f"--rdzv_id={cfg.rdzv_id or 'vriksha'}",
        ]
        if cfg.node_rank is not None:
            cmd.append(f"--node_rank={cfg.node_rank}")
    return [*cmd, "-m", "vriksha.train", *argv]


def run_torchrun(cfg: TorchrunConfig, argv: list[str]) -> int:
    """Run this node's ranks through torchrun; each gets this node's cores over its `nproc` processes as OMP
    threads (unless OMP_NUM_THREADS is set)."""
    cmd = torchrun_command(cfg, argv)
    logger.info("launching %s", " ".join(cmd))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_process(cfg.nproc)))
    return subprocess.call(cmd, env=env)


_VALUED = (
    "--nproc",
    "--nnodes",
    "--node-rank",
    "--rdzv-endpoint",
    "--rdzv-backend",
    "--rdzv-id",
    "--launcher",
)


def strip_launch_flags(argv: list[str]) -> list[str]:
    """`argv` without the launch flags (each rank gets the rest: the config and its overrides)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _VALUED:
            skip = True
            continue
        if a.split("=", 1)[0] in _VALUED:
            continue
        out.append(a)
    return out


def from_args(args: argparse.Namespace) -> TorchrunConfig:
    from vriksha.net.flags import from_args as dataclass_from_args

    return dataclass_from_args(TorchrunConfig, args)
