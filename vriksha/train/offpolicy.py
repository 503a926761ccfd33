"""The trainer's side of off-policy rollouts (`rollout.max_staleness >= 1`): the producer over its own copy
of the weights and its own engine, each step's batch with its staleness, new weights handed over, the
queue saved.

The producer owns its rollout: it gets its module, a way to build its engine over that module, what a
step plays (`StepRollout`) and where new weights come from (`PolicyWeights`), and nothing of the trainer.

Resume: the queue is checkpointed, not regenerated. A checkpoint after step s holds the batches of
steps s+1 .. s+K, played under versions older than s that the checkpoint cannot reproduce; it waits
for them first. The resumed producer goes on from step s+K+1 under version s, so a resumed run trains
on exactly what the uninterrupted run did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from vriksha.envs.play import Episode
from vriksha.envs.rollout_engine import RolloutEngine
from vriksha.train.async_rollout import AsyncRollout, RolloutBatch, StalenessStats
from vriksha.train.dynamic_sampling import SampledGroups
from vriksha.train.rollout import StepRollout
from vriksha.train.rollout_engine import TrainingEngine

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

__all__ = ["OffPolicy", "OffPolicyMetrics", "PolicyWeights", "TakenBatch"]


class PolicyWeights(Protocol):
    """Where new weight versions come from: the policy's full tensors, current, in the parameter order
    of the producer's module (`distributed.EngineWeights`)."""

    def full_tensors(self) -> list[torch.Tensor]: ...


@dataclass(slots=True)
class OffPolicyMetrics:
    version: int  # the weight version the batch was played under
    staleness: int  # versions behind the trainer's
    histogram: list[int]  # groups trained per lag 0..K
    dropped_groups: int
    dropped_total: int
    batches_ready: int  # this one included
    wait_s: float  # the trainer's wait for it

    def row(self) -> dict[str, Any]:
        return {
            "async/version": self.version,
            "async/staleness_mean": float(self.staleness),
            "async/staleness_max": self.staleness,
            "async/staleness_hist": self.histogram,
            "async/dropped_groups": self.dropped_groups,
            "async/dropped_total": self.dropped_total,
            "perf/batches_ready": self.batches_ready,
            "time/rollout_wait_s": self.wait_s,
        }


@dataclass(slots=True)
class TakenBatch:
    """One step's groups as the producer played them, and what the staleness bound made of them."""

    groups: list[list[Episode]]
    seconds: float  # playing them took
    dropped: bool  # past max_staleness: trained on by no optimizer step
    sampled: SampledGroups | None  # what dynamic sampling played; None for a batch restored from a checkpoint
    metrics: OffPolicyMetrics


class OffPolicy:
    def __init__(
        self,
        module: PreTrainedModel,
        make_engine: Callable[[PreTrainedModel], TrainingEngine],
        rollout: StepRollout,
        weights: PolicyWeights,
        *,
        max_staleness: int,
        start_version: int,
        last_step: int,
        saved: Mapping[str, Any] | None = None,
    ) -> None:
        """`module`: the producer's own copy of the model (loaded only between its batches);
        `make_engine(module)`: its engine; `saved`: what `state` returned at the checkpoint resumed from."""
        from vriksha.envs.registry import get_env_class

        saved = saved or {}
        self.max_staleness = max_staleness
        self.dropped_total = int(saved.get("async_dropped_total", 0))
        self.weights = weights
        self._sampled: dict[int, SampledGroups] = {}  # what the producer played, by step, until taken
        get_env_class(rollout.env.name)  # the registry loads its providers on first use, not thread-safely
        params = list(module.parameters())
        with torch.no_grad():
            for q, p in zip(params, weights.full_tensors(), strict=True):
                q.data.copy_(p)
        self.engine = make_engine(module)
        restored = [RolloutBatch.from_dict(b) for b in saved.get("rollout_queue", [])]
        restored = [b for b in restored if b.step > start_version]
        if restored:
            logger.info("rollout queue restored from the checkpoint: steps %s", [b.step for b in restored])

        def play(engine: RolloutEngine, step: int) -> list[list[Episode]]:
            sampled = rollout.play(engine, step)
            self._sampled[step] = sampled
            return sampled.groups

        self.producer = AsyncRollout(
            self.engine,
            params,
            play,
            max_staleness=max_staleness,
            start_version=start_version,
            last_step=last_step,
            restored=restored,
        ).start()

    def take(self, step: int) -> TakenBatch:
        """This step's groups, waiting for the producer to finish them."""
        t0 = time.perf_counter()
        batch = self.producer.get(step)
        wait = time.perf_counter() - t0
        st = StalenessStats.of(batch, step - 1, self.max_staleness)
        self.dropped_total += st.dropped
        metrics = OffPolicyMetrics(
            version=batch.version,
            staleness=st.lag,
            histogram=st.histogram,
            dropped_groups=st.dropped,
            dropped_total=self.dropped_total,
            batches_ready=len(self.producer.queued_steps()) + 1,
            wait_s=wait,
        )
        sampled = self._sampled.pop(step, None)
        return TakenBatch(batch.groups, batch.seconds, st.dropped > 0, sampled, metrics)

    def publish(self, step: int) -> float:
        """Hand the producer the policy's weights after `step` (version `step`); returns seconds."""
        return self.producer.publish(step, self.weights.full_tensors())

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint after `step` saves (and `saved` gives back on resume)."""
        return {
            "rollout_queue": [b.to_dict() for b in self.producer.pending(step)],
            "max_staleness": self.max_staleness,
            "async_dropped_total": self.dropped_total,
        }

    def close(self) -> None:
        self.producer.close()
        self.engine.close()
