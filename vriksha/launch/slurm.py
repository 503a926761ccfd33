"""What a Slurm step says about the nodes, for a training started with `srun vriksha train ...`.

One task per node (`srun --ntasks-per-node=1`): each task runs torchrun for its node's processes, node 0's
first host name is the rendezvous (MASTER_ADDR where the batch script sets it), the job id names it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from vriksha.errors import ConfigError

__all__ = ["SlurmStep", "expand_nodelist", "from_slurm"]


@dataclass(frozen=True, slots=True)
class SlurmStep:
    nnodes: int
    node_rank: int
    head: str  # the host of the rendezvous
    job_id: str


_GROUP = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compact host list (`gpu[01-03,07],login1`) as names (`gpu01, gpu02, gpu03, gpu07, login1`)."""
    hosts: list[str] = []
    pos = 0
    while pos < len(nodelist):
        m = _GROUP.match(nodelist, pos)
        if m is None:
            raise ConfigError(f"SLURM_JOB_NODELIST: cannot read {nodelist!r} at position {pos}")
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            hosts.append(prefix)
        else:
            for part in ranges.split(","):
                lo, _, hi = part.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise ConfigError(f"SLURM_JOB_NODELIST: cannot read the range {part!r} in {nodelist!r}")
                for n in range(int(lo), int(hi or lo) + 1):
                    hosts.append(f"{prefix}{n:0{len(lo)}d}")
        pos = m.end()
        if pos < len(nodelist):
            if nodelist[pos] != ",":
                raise ConfigError(f"SLURM_JOB_NODELIST: cannot read {nodelist!r} at position {pos}")
            pos += 1
    return hosts


def from_slurm(env: Mapping[str, str]) -> SlurmStep | None:
    """The step's nodes from SLURM_* variables, or None outside a Slurm job step."""
    nnodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    node = env.get("SLURM_NODEID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nnodes is None or node is None or (nodelist is None and "MASTER_ADDR" not in env):
        return None
    head = env.get("MASTER_ADDR") or expand_nodelist(str(nodelist))[0]
    return SlurmStep(int(nnodes), int(node), head, env.get("SLURM_JOB_ID", "vriksha"))
