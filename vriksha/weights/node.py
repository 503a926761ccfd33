"""Which node a process runs on, as far as shared memory is concerned.

Two processes can exchange weights through a file in /dev/shm only when they see the same /dev/shm: the same
machine (host name and kernel boot id) and the same mount of /dev/shm (containers and IPC namespaces on one
machine each have their own). A URL's host name says none of that: `127.0.0.1` inside two containers, or two
machines behind one load balancer name, look alike. So each side states its identity and the trainer compares.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    hostname: str
    boot_id: str  # empty where the kernel does not say (not Linux)
    shm_device: str  # "major:minor" of the file system under /dev/shm; empty where there is none

    def shares_memory_with(self, other: NodeIdentity) -> bool:
        """True when a file this node writes under /dev/shm is the file `other` reads there."""
        return bool(self.shm_device) and self == other

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> NodeIdentity | None:
        """The identity a peer sent, or None when it sent none (or not in this shape)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(str(data["hostname"]), str(data["boot_id"]), str(data["shm_device"]))
        except KeyError:
            return None


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _shm_device() -> str:
    try:
        st = os.stat(SHM_DIR)
    except OSError:
        return ""
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


@cache
def node_identity() -> NodeIdentity:
    """This process's node identity (read once: none of it changes while a process runs)."""
    return NodeIdentity(socket.gethostname(), _boot_id(), _shm_device())
