"""The actors of a job: a service (a `vriksha serve`, `vriksha router` or `vriksha env serve` process on the
actor's node, at an address the restarted actor takes again) and a trainer rank (today's trainer, in the actor's
process, joined to the others by the torch.distributed variables rank 0 published)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ServiceActor", "TrainerRank", "node_address"]


def node_address() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _die_with_parent() -> None:  # in the child: SIGTERM when the actor's process dies (Linux)
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServiceActor:
    """One server as a child process of this actor. `argv` (after `vriksha`) may name `{host}`, `{port}` and
    `{port2}`: this node's address and the ports given (picked here when None, then kept by a restart)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        threads: int,
        ports: tuple[int | None, int | None] = (None, None),
        startup_timeout_s: float = 600.0,
        secrets: dict[str, str] | None = None,
    ) -> None:
        from vriksha.net.health import wait_healthy
        from vriksha.net.launch import free_port, vriksha_command

        self.name = name
        self.host = node_address()
        self.ports = (ports[0] or free_port(self.host), ports[1] or free_port(self.host))
        fields = {"host": self.host, "port": self.ports[0], "port2": self.ports[1]}
        cmd = vriksha_command(*(a.format(**fields) for a in argv), log_level="WARNING")
        env = {**os.environ, **(secrets or {}), "OMP_NUM_THREADS": str(threads)}
        log_dir = Path(tempfile.gettempdir()) / "vriksha-ray"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name.replace(' ', '-')}-{os.getpid()}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (open while the child runs)
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
        try:
            wait_healthy(self.url, startup_timeout_s, name)
        except Exception:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} did not start ({' '.join(cmd)}):\n{tail}") from None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports[0]}"

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "ports": list(self.ports), "host": self.host, "pid": os.getpid(),
                "child_pid": self.proc.pid, "log": str(self.log_path)}  # fmt: skip

    def watch(self) -> int:
        """Block while the server runs; its exit status (the driver restarts a service whose watch ends)."""
        return self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class TrainerRank:
    """One trainer rank: sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, then
    runs today's trainer in this process."""

    def __init__(self, rank: int, world_size: int, threads: int) -> None:
        self.rank, self.world_size, self.threads = rank, world_size, threads

    def where(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), node_address()

    def publish_address(self) -> tuple[str, int]:
        """Rank 0: an address on its node for the process group's store."""
        from vriksha.net.launch import free_port

        host = node_address()
        return host, free_port(host)

    def run(
        self,
        cfg: dict[str, Any],
        resume: bool,
        master: tuple[str, int],
        local: tuple[int, int],
        secrets: dict[str, str] | None = None,
    ) -> int:
        import torch

        os.environ.update(secrets or {})
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(local[0]),
            LOCAL_WORLD_SIZE=str(local[1]),
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            OMP_NUM_THREADS=str(self.threads),
        )
        torch.set_num_threads(self.threads)
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from vriksha.train.cli import run_in_process
        from vriksha.train.config import TrainConfig

        t0 = time.monotonic()
        rc = run_in_process(TrainConfig.from_dict(cfg), resume)
        logger.info("trainer rank %d done in %.1f s", self.rank, time.monotonic() - t0)
        return rc
