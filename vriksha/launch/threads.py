"""CPU threads per process: this node's usable cores (its affinity mask, e.g. a Slurm or container cgroup set)
over the processes this node runs (LOCAL_WORLD_SIZE), never the whole job's."""

from __future__ import annotations

import os

__all__ = ["local_world_size", "threads_per_process", "usable_cores"]


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def local_world_size(default: int = 1) -> int:
    """Processes of this job on this node: torchrun's LOCAL_WORLD_SIZE, else `default`."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", default))


def threads_per_process(local_processes: int | None = None) -> int:
    """This node's cores split evenly over its `local_processes` (default: LOCAL_WORLD_SIZE), at least one."""
    n = local_processes if local_processes is not None else local_world_size()
    return max(1, usable_cores() // max(1, n))
