"""Rank 0 of a tensor-parallel engine: it spawns the other ranks, holds the scheduler, broadcasts each step's
batch before running its own share of the forward pass, samples, and stops the ranks at `close()`.

A rank that dies (killed, out of memory, an exception) fails rank 0's next collective at once (gloo reports
the lost connection; the group's timeout bounds the wait on other backends); rank 0 then names the rank and
how it ended, stops the others, and every later step raises the same `TensorParallelError`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

import vriksha.device as devices
from vriksha.engine.config import EngineConfig
from vriksha.engine.platform import compute_dtype
from vriksha.engine.runner.step import ForwardStep
from vriksha.engine.tensor_parallel import worker
from vriksha.engine.tensor_parallel.comm import Collectives, check_no_group
from vriksha.engine.tensor_parallel.shard import check_degree, shard_model
from vriksha.engine.tensor_parallel.step import pack, stop_message
from vriksha.errors import ConfigError, EngineFailedError
from vriksha.profiling import phase

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 900.0  # loading the model on every rank of a busy host
STOP_TIMEOUT_S = 10.0
COLLECTIVE_TIMEOUT_S = 300.0  # a rank that hangs (rather than dies) fails the step after this long


class TensorParallelError(EngineFailedError):
    """A tensor-parallel rank failed; the engine cannot go on (restart it)."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_size(config: EngineConfig, size: int) -> None:
    """The degree against the model's heads and the devices there are, before any rank is started."""
    from transformers import AutoConfig

    from vriksha.loading import resolve_model_path

    check_no_group()
    check_degree(AutoConfig.from_pretrained(resolve_model_path(config.model)), size)
    device = devices.resolve(config.device)
    if devices.is_host(device):
        if size > _cores():
            logger.warning(
                "tensor_parallel_size %d > %d cores: the ranks share cores (one thread each)", size, _cores()
            )
        return
    if device.index is not None:
        raise ConfigError(
            f"tensor_parallel_size {size} puts rank r on device index r; pass the device kind "
            f"({device.type}) without an index"
        )
    count = devices.device_count()
    if size > count:
        raise ConfigError(f"tensor_parallel_size {size} needs {size} {device.type} devices, found {count}")


class TensorParallelGroup:
    """The ranks 1..N-1 of an engine on N ranks, and rank 0's collectives over all of them."""

    def __init__(self, config: EngineConfig) -> None:
        self.size = size = config.tensor_parallel_size
        check_size(config, size)
        self.device = devices.local_device(0, config.device)
        self.dtype_choice = compute_dtype.resolve(config.dtype, config.model, self.device)
        self.failure: TensorParallelError | None = None
        self.comm: Collectives | None = None
        self._threads = torch.get_num_threads()
        threads = max(1, _cores() // size)
        self.store = dist.TCPStore(
            worker.STORE_HOST, 0, size, is_master=True, wait_for_workers=False,
            timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
        )  # fmt: skip
        # fresh interpreters (not multiprocessing's spawn, which re-imports the caller's main module)
        ranks_config = {**config.to_dict(), "dtype": self.dtype_choice.name}
        spec = {"size": size, "config": ranks_config, "port": self.store.port, "threads": threads}
        spec.update(parent_pid=os.getpid(), timeout_s=STARTUP_TIMEOUT_S)
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "vriksha.engine.tensor_parallel", json.dumps({**spec, "rank": r})],
                stdin=subprocess.DEVNULL,
            )
            for r in range(1, size)
        ]
        self._finalizer = weakref.finalize(self, _kill, list(self.procs))
        if devices.is_host(self.device):
            torch.set_num_threads(threads)
        logger.info("tensor parallel: %d ranks, %d threads each", size, threads)

    def join(self, model: nn.Module) -> nn.Module:
        """Wait for every rank to load the model, form the group, and keep rank 0's shard of `model`."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        waiting = set(range(1, self.size))
        while waiting:
            for r in sorted(waiting):
                if self.store.check([f"loaded/{r}"]):
                    waiting.discard(r)
                elif self.store.check([f"error/{r}"]) or self.procs[r - 1].poll() is not None:
                    raise self._fail(f"rank {r} failed to start", starting=True)
            if time.monotonic() > deadline:
                raise self._fail(
                    f"ranks {sorted(waiting)} did not load the model in {STARTUP_TIMEOUT_S:.0f} s",
                    starting=True,
                )
            time.sleep(0.05)
        self.comm = Collectives(self.store, 0, self.size, self.device, COLLECTIVE_TIMEOUT_S, self._on_error)
        return shard_model(model, 0, self.size, self.comm.all_reduce)

    def min_slots(self, slots: int) -> int:
        """The KV slots every rank can hold (each holds kv_heads / N heads of each)."""
        return self.comm.min_int(slots)

    def run_step(self, path: Callable[[ForwardStep], torch.Tensor], step: ForwardStep) -> torch.Tensor:
        """Broadcast the step, then run rank 0's share of it on `path`. A failure part-way (here or on another
        rank) leaves the ranks at different collectives, so any error ends the group."""
        if self.failure is not None:
            raise self.failure
        for r, proc in enumerate(self.procs, 1):
            if proc.poll() is not None:
                raise self._fail(f"rank {r} exited")
        try:
            inputs = step.inputs
            with phase("engine.tp_broadcast"):
                self.comm.send(pack(inputs.input_ids, inputs.position_ids, inputs.attn))
            return path(step)
        except TensorParallelError:
            raise
        except BaseException as exc:
            raise self._fail(f"rank 0 failed in its forward pass ({type(exc).__name__}: {exc})") from exc

    def _on_error(self, exc: BaseException) -> BaseException:
        return self.failure or self._fail(f"a collective failed ({str(exc).splitlines()[0][:200]})")

    def _fail(self, what: str, starting: bool = False) -> TensorParallelError:
        """Name the ranks that ended and how, stop the rest; the error every later step raises."""
        if self.failure is not None:
            return self.failure
        deadline = time.monotonic() + 2.0  # a peer's exit reaches the collective before its exit code is seen
        while all(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = []
        for r, proc in enumerate(self.procs, 1):
            if proc.poll() is None:
                continue
            how = (
                f"was killed by {signal.Signals(-proc.returncode).name}"
                if proc.returncode < 0
                else f"exited with status {proc.returncode}"
            )
            note = self._reported(r)
            ended.append(f"rank {r} (pid {proc.pid}) {how}{': ' + note if note else ''}")
        detail = "; ".join(ended) if ended else "no rank has exited"
        after = (
            "check the rank's log above" if starting else "the requests in flight failed; restart the engine"
        )
        self.failure = TensorParallelError(
            f"tensor-parallel engine {'could not start' if starting else 'stopped'}: {what}: {detail}; {after}"
        )
        logger.error("%s", self.failure)
        self._teardown()
        return self.failure

    def _reported(self, rank: int) -> str:
        try:
            if self.store.check([f"error/{rank}"]):
                return self.store.get(f"error/{rank}").decode(errors="replace")
        except Exception:  # noqa: BLE001 - the store itself may be unreachable now
            pass
        return ""

    def _teardown(self) -> None:
        _kill(self.procs)
        if self.comm is not None:
            self.comm.close()
        if devices.is_host(self.device):
            torch.set_num_threads(self._threads)
        self._finalizer.detach()

    def close(self) -> None:
        """Stop the other ranks (they finish the step in flight) and leave the group; safe to call twice."""
        if self.failure is None and self.comm is not None and not self.comm.closed:
            try:
                self.comm.send(stop_message())
            except Exception:  # noqa: BLE001 - a rank already gone: the teardown below still runs
                logger.debug("stop message not delivered", exc_info=True)
            for proc in self.procs:
                _wait(proc, STOP_TIMEOUT_S)
        self._teardown()


def _wait(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        _wait(proc, STOP_TIMEOUT_S)
