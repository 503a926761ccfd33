"""The trainer's side of off-policy rollouts (`rollout.max_staleness >= 1`): start the producer over its own
copy of the weights, take each step's batch with its staleness, hand over new weights, save the queue.

Resume: the queue is checkpointed, not regenerated. A checkpoint after step s holds the batches of
steps s+1 .. s+K, played under versions older than s that the checkpoint cannot reproduce; it waits
for them first. The resumed producer goes on from step s+K+1 under version s, so a resumed run trains
on exactly what the uninterrupted run did.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from vriksha.train.async_rollout import AsyncRollout, RolloutBatch, StalenessStats
from vriksha.train.rollout import Episode, RolloutWorker

logger = logging.getLogger(__name__)

__all__ = ["OffPolicy"]


class OffPolicy:
    def __init__(self, trainer: Any, module: nn.Module) -> None:
        from vriksha.envs.registry import get_env_class
        from vriksha.train.trainer import build_engine

        cfg = trainer.cfg
        self.max_staleness = cfg.rollout.max_staleness
        self.dropped_total = int(trainer.state.get("async_dropped_total", 0))
        get_env_class(cfg.env.name)  # the registry loads its providers on first use, not thread-safely
        trainer.engine_weights.sync()
        params = list(module.parameters())
        self.publish_params = list(trainer.engine_module.parameters())  # the policy's values (aliased)
        with torch.no_grad():
            for q, p in zip(params, self.publish_params, strict=True):
                q.data.copy_(p.data)
        if cfg.rollout.mode == "server":
            from vriksha.train.server_rollout import ServerRollout

            self.llm: Any = ServerRollout(
                cfg.rollout,
                cfg.model,
                module,
                trainer.tokenizer,
                trainer.out_dir,
                trainer.pd.rank,
                trainer.start_step,
            )
        else:
            self.llm = build_engine(module, trainer.tokenizer, cfg.rollout.engine)
        restored = [RolloutBatch.from_dict(b) for b in trainer.state.get("rollout_queue", [])]
        restored = [b for b in restored if b.step > trainer.start_step]
        if restored:
            logger.info("rollout queue restored from the checkpoint: steps %s", [b.step for b in restored])
        tc = cfg.trainer
        stop_at = tc.steps if tc.stop_after is None else min(tc.steps, trainer.start_step + tc.stop_after)

        def play(engine: Any, step: int) -> list[list[Episode]]:
            worker = RolloutWorker(engine, trainer.tokenizer, cfg.env, cfg.rollout)
            return trainer._rollout(step, worker)

        # K batches past the last step of this invocation: what a checkpoint there needs next
        self.producer = AsyncRollout(
            self.llm,
            params,
            play,
            max_staleness=self.max_staleness,
            start_version=trainer.start_step,
            last_step=min(tc.steps, stop_at + self.max_staleness),
            restored=restored,
        ).start()

    def take(self, step: int) -> tuple[list[list[Episode]], float, bool, dict[str, Any]]:
        """This step's groups, the seconds playing them took, whether they are dropped, and the metrics."""
        t0 = time.perf_counter()
        batch = self.producer.get(step)
        wait = time.perf_counter() - t0
        st = StalenessStats.of(batch, step - 1, self.max_staleness)
        self.dropped_total += st.dropped
        metrics = {
            "async/version": batch.version,
            "async/staleness_mean": float(st.lag),
            "async/staleness_max": st.lag,
            "async/staleness_hist": st.histogram,
            "async/dropped_groups": st.dropped,
            "async/dropped_total": self.dropped_total,
            "perf/batches_ready": len(self.producer.queued_steps()) + 1,
            "time/rollout_wait_s": wait,
        }
        return batch.groups, batch.seconds, st.dropped > 0, metrics

    def publish(self, step: int) -> float:
        return self.producer.publish(step, [p.data for p in self.publish_params])

    def state(self, step: int) -> dict[str, Any]:
        return {
            "rollout_queue": [b.to_dict() for b in self.producer.pending(step)],
            "max_staleness": self.max_staleness,
            "async_dropped_total": self.dropped_total,
        }

    def close(self) -> None:
        self.producer.close()
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()
