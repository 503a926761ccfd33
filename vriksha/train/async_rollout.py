"""Off-policy rollouts: a producer thread plays the episodes of step k+1 while the trainer trains step k.

Schedule. With `rollout.max_staleness = K >= 1`, the batch of step j is played under the weights of
version v(j) = max(v0, j - 1 - K), where version n is the policy after step n and v0 the version the
run started (or resumed) from. The trainer at step j holds version j - 1, so the batch lags
min(K, j - 1 - v0) versions: the producer runs K batches ahead and never waits in steady state. The
schedule is fixed, not "the newest weights at hand", so a run depends on its seeds alone and a resumed
run repeats an uninterrupted one.

Weights. `publish(n, tensors)` (the trainer's thread, after step n) copies the policy's full tensors
into a staging buffer; at most K staged versions wait. Before a batch, the producer copies the version
it needs into its own module and tells its engine (`set_weight_version`: colocated, the engine's caches
are reset; server mode, the servers get a push under that version). Copies per update: one into the
staging buffer, one into the producer's module (plus the push in server mode).

Partial rollouts. A weight update never reaches a batch in flight: the producer loads weights only
between batches, so every request of a batch, every turn of every episode, is computed under the
version the batch started with (it finishes under its old version; nothing is recomputed). A batch is
credited to the oldest version any of its outputs reports.

Staleness bound. A batch that lags more than K versions when the trainer takes it (restored from a
checkpoint of a run with a larger K, or answered by a server under an older version) is dropped and
counted; the importance weight pi_old / pi_engine of the loss (`grpo.importance_correction`) corrects
the lag of the rest, since the engine log-probs are those of the weights that sampled the tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vriksha.envs.play import Episode
from vriksha.envs.rollout_engine import PassThroughEngine, RolloutEngine
from vriksha.errors import VrikshaError
from vriksha.train.rollout_engine import TrainingEngine

if TYPE_CHECKING:
    from vriksha import RequestOutput

logger = logging.getLogger(__name__)

__all__ = ["AsyncRollout", "AsyncRolloutError", "RolloutBatch", "StalenessStats", "planned_version"]

WAIT_POLL_S = 0.5


class AsyncRolloutError(VrikshaError):
    """The rollout producer failed (its error is the cause) or was asked for a batch it will not play."""


def planned_version(step: int, start_version: int, max_staleness: int) -> int:
    """The weight version the batch of `step` is played under: max(v0, step - 1 - K)."""
    return max(start_version, step - 1 - max_staleness)


@dataclass(slots=True)
class RolloutBatch:
    """One step's groups, the version they were played under and how long playing them took."""

    step: int
    version: int  # the oldest weight version any output of the batch reports
    groups: list[list[Episode]]
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "version": self.version,
            "seconds": self.seconds,
            "groups": [[dataclasses.asdict(e) for e in g] for g in self.groups],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutBatch:
        return cls(
            step=int(data["step"]),
            version=int(data["version"]),
            groups=[[Episode(**e) for e in g] for g in data["groups"]],
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(slots=True)
class StalenessStats:
    """What the staleness bound did to one batch: the groups kept, their lag, the groups dropped."""

    kept: list[list[Episode]]
    lag: int
    dropped: int
    histogram: list[int] = field(default_factory=list)  # groups trained per lag 0..K

    @classmethod
    def of(cls, batch: RolloutBatch, trainer_version: int, max_staleness: int) -> StalenessStats:
        lag = trainer_version - batch.version
        if lag < 0:
            raise AsyncRolloutError(
                f"the batch of step {batch.step} was played under version {batch.version}, newer than the "
                f"trainer's {trainer_version}: the rollout queue does not belong to this run"
            )
        histogram = [0] * (max_staleness + 1)
        if lag > max_staleness:
            logger.warning(
                "step %d: dropping %d groups played under version %d, %d versions behind (max_staleness %d)",
                batch.step,
                len(batch.groups),
                batch.version,
                lag,
                max_staleness,
            )
            return cls([], lag, len(batch.groups), histogram)
        histogram[lag] = len(batch.groups)
        return cls(list(batch.groups), lag, 0, histogram)


class _VersionTap(PassThroughEngine):
    """Notes the weight version each output reports."""

    def __init__(self, llm: RolloutEngine) -> None:
        super().__init__(llm)
        self.seen_versions: set[int] = set()

    def observe(self, outputs: list[RequestOutput]) -> None:
        self.seen_versions.update(o.weight_version for o in outputs)


class AsyncRollout:
    """The producer thread, its module and engine, the staged weights and the finished batches.

    `play(engine, step)` plays the groups of `step` on a `RolloutEngine` (the off-policy producer passes
    its `StepRollout`'s); `llm` is the producer's engine over the module whose parameters are `params`
    (in the order `publish` gets tensors), which nothing else touches.
    """

    def __init__(
        self,
        llm: TrainingEngine,
        params: Sequence[torch.Tensor],
        play: Callable[[RolloutEngine, int], list[list[Episode]]],
        *,
        max_staleness: int,
        start_version: int,
        last_step: int,
        restored: Sequence[RolloutBatch] = (),
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 for off-policy rollouts, got {max_staleness}")
        self.llm = llm
        self.play = play
        self.max_staleness = max_staleness
        self.start_version = start_version
        self.last_step = last_step
        self._params = list(params)
        self._staged: queue.Queue[tuple[int, list[torch.Tensor]]] = queue.Queue(maxsize=max_staleness)
        self._free: list[list[torch.Tensor]] = []
        self._free_lock = threading.Lock()
        self._cond = threading.Condition()
        self._done: dict[int, RolloutBatch] = {b.step: b for b in restored}
        self._next = max(self._done, default=start_version) + 1
        self._loaded = start_version
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self.copy_s = 0.0  # producer time spent loading staged weights
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self) -> AsyncRollout:
        self.llm.set_weight_version(self.start_version)
        self._thread.start()
        return self

    # -- the trainer's side ------------------------------------------------

    def publish(self, version: int, tensors: Sequence[torch.Tensor]) -> float:
        """Stage the policy's full tensors (in the module's parameter order) as `version`; returns seconds.

        Blocks only while K staged versions still wait for the producer; a version no batch of the run
        is planned under is not staged."""
        t0 = time.perf_counter()
        if version > planned_version(self.last_step, self.start_version, self.max_staleness):
            return 0.0
        with self._free_lock:
            buf = self._free.pop() if self._free else None
        if buf is None:
            buf = [torch.empty_like(p) for p in self._params]
        if len(tensors) != len(buf):
            raise AsyncRolloutError(
                f"publish got {len(tensors)} tensors for a module of {len(buf)} parameters"
            )
        with torch.no_grad():
            for dst, src in zip(buf, tensors, strict=True):
                dst.copy_(src)
        while True:
            self._raise_if_failed()
            try:
                self._staged.put((version, buf), timeout=WAIT_POLL_S)
                break
            except queue.Full:
                continue
        return time.perf_counter() - t0

    def get(self, step: int, timeout: float | None = None) -> RolloutBatch:
        """The batch of `step`, waiting for the producer to finish it; it leaves the queue."""
        batch = self._wait(step, timeout)
        with self._cond:
            self._done.pop(step, None)
        return batch

    def pending(self, after: int, timeout: float | None = None) -> list[RolloutBatch]:
        """Every batch the schedule has played or will play before the trainer publishes `after`'s weights
        (steps after+1 .. after+K, within the run), waiting for them: what a checkpoint at `after` saves."""
        last = min(self.last_step, after + self.max_staleness)
        return [self._wait(j, timeout) for j in range(after + 1, last + 1)]

    def queued_steps(self) -> list[int]:
        with self._cond:
            return sorted(self._done)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _wait(self, step: int, timeout: float | None) -> RolloutBatch:
        if step > self.last_step:
            raise AsyncRolloutError(
                f"step {step} is past the last step the producer plays ({self.last_step})"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while step not in self._done:
                self._raise_if_failed()
                if step < self._next or not self._thread.is_alive():
                    raise AsyncRolloutError(
                        f"the producer will not play step {step} (taken already, or the producer stopped; "
                        f"next: {self._next})"
                    )
                if deadline is not None and time.monotonic() > deadline:
                    raise AsyncRolloutError(f"the batch of step {step} was not ready after {timeout} s")
                self._cond.wait(WAIT_POLL_S)
            return self._done[step]

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise AsyncRolloutError(f"the rollout producer failed: {self._error}") from self._error

    # -- the producer's side ------------------------------------------------

    def _load(self, version: int) -> None:
        """Take staged versions in order until `version` is loaded into the module and its engine."""
        while self._loaded < version:
            try:
                staged, buf = self._staged.get(timeout=WAIT_POLL_S)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            t0 = time.perf_counter()
            with torch.no_grad():
                for p, src in zip(self._params, buf, strict=True):
                    p.data.copy_(src)
            with self._free_lock:
                self._free.append(buf)
            self.llm.set_weight_version(staged)
            self._loaded = staged
            self.copy_s += time.perf_counter() - t0

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self._next <= self.last_step:
                step = self._next
                self._load(planned_version(step, self.start_version, self.max_staleness))
                if self._stop.is_set():
                    return
                if not self.llm.flush_cache():  # every batch starts from a cold prefix cache, as in sync mode
                    logger.warning("prefix cache not fully flushed before the batch of step %d", step)
                tap = _VersionTap(self.llm)
                t0 = time.perf_counter()
                groups = self.play(tap, step)
                version = min(tap.seen_versions, default=self._loaded)
                if len(tap.seen_versions) > 1:
                    logger.warning(
                        "the batch of step %d came from versions %s", step, sorted(tap.seen_versions)
                    )
                batch = RolloutBatch(step, version, groups, time.perf_counter() - t0)
                with self._cond:
                    self._done[step] = batch
                    self._next = step + 1
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the trainer's thread by get/publish
            logger.exception("rollout producer failed")
            self._error = exc
            with self._cond:
                self._cond.notify_all()
