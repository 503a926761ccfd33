"""Training episodes through the engine, captured token for token.

The episodes are played by `vriksha.envs.play.play_groups` (the loop `vriksha env eval` runs too):
each group is one environment episode played `group_size` times, its first turn one engine request
with `n = group_size`; every turn goes through the environments' `EpisodeDriver`, and the token ids
are the engine's own (`Transcript`). What comes back is the `Episode` record that the update trains on.

`StepRollout` is what a rank plays at a step: its share of the step's prompts, their episode and
sampling seeds, and the extra rounds of dynamic sampling. The trainer runs it on its engine; the
off-policy producer (`offpolicy.py`) runs the same on its own engine, ahead of the trainer.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vriksha.envs import make_env
from vriksha.envs.episode import EpisodeEnv
from vriksha.envs.play import Episode, Sampling, play_groups
from vriksha.envs.protocol import EnvConnectionError, ErrorCode, RemoteEnvError
from vriksha.envs.rollout_engine import RolloutEngine
from vriksha.envs.transcript import PromptFormat
from vriksha.profiling import phase
from vriksha.train.config import EnvConfig, RolloutConfig
from vriksha.train.distributed import shard_range
from vriksha.train.dynamic_sampling import SampledGroups, sample_with_signal
from vriksha.train.remote_envs import RemoteEnvs

logger = logging.getLogger(__name__)

__all__ = ["Episode", "RolloutWorker", "StepRollout", "episode_seed"]

REPLAYS = 3  # plays of one batch repeated after an environment server was lost


def episode_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (run seed, step, prompt index, ...)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class RolloutWorker:
    """Plays episodes of one environment on a `RolloutEngine`."""

    def __init__(self, llm: RolloutEngine, tokenizer: Any, env_cfg: EnvConfig, cfg: RolloutConfig) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.env_cfg = env_cfg
        self.cfg = cfg
        self.prompt_format = PromptFormat(
            chat_template=cfg.chat_template,
            system_prompt=cfg.system_prompt,
            describe_tools=cfg.describe_tools,
        )

        self._remote = RemoteEnvs(env_cfg.servers) if env_cfg.servers else None

    def _new_env(self) -> EpisodeEnv:
        if self._remote is not None:
            return self._remote.session()
        return make_env(self.env_cfg.name, **self.env_cfg.kwargs)

    def play(
        self,
        seeds: Sequence[int],
        split: str,
        group_size: int,
        sampling_seeds: Sequence[int] | None = None,
        greedy: bool = False,
        max_new_tokens: int | None = None,
    ) -> list[list[Episode]]:
        """Play `group_size` episodes for each episode seed; returns one list per seed (a group)."""
        sampling = Sampling(
            temperature=0.0 if greedy else self.cfg.temperature,
            top_p=self.cfg.top_p,
            max_tokens=max_new_tokens or self.cfg.max_new_tokens,
        )
        for attempt in range(REPLAYS + 1):
            try:
                groups = self._play(seeds, split, group_size, sampling, sampling_seeds)
                break
            except (EnvConnectionError, RemoteEnvError) as exc:
                lost = isinstance(exc, EnvConnectionError) or exc.code == ErrorCode.UNKNOWN_SESSION
                if self._remote is None or not lost or attempt == REPLAYS:
                    raise
                # a server restarted mid-play lost its sessions: the same seeds play the same episodes again
                logger.warning("environment server lost (%s); replaying the batch", exc)
                self._remote.wait_all()
        return groups

    def _play(
        self,
        seeds: Sequence[int],
        split: str,
        group_size: int,
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None,
    ) -> list[list[Episode]]:
        return play_groups(
            self.llm,
            self.tokenizer,
            self._new_env,
            seeds,
            options={**self.env_cfg.options, "split": split},
            group_size=group_size,
            sampling=sampling,
            sampling_seeds=None if sampling_seeds is None else [int(s) for s in sampling_seeds],
            max_turns=self.cfg.max_turns,
            prompt_format=self.prompt_format,
            action_shape=self._remote.action_shape if self._remote is not None else None,
        )


@dataclass(frozen=True, slots=True)
class StepRollout:
    """The groups one rank plays at a step: prompt i of the step is episode seed
    `episode_seed(run_seed, step, i)`, sampled from `episode_seed(run_seed, step, i, 1)`; round r > 0
    of dynamic sampling plays prompts `i + r * prompts_per_step` (fresh ones)."""

    tokenizer: Any
    env: EnvConfig
    rollout: RolloutConfig
    run_seed: int
    rank: int = 0
    world_size: int = 1

    def play(self, engine: RolloutEngine, step: int) -> SampledGroups:
        worker = RolloutWorker(engine, self.tokenizer, self.env, self.rollout)
        prompts = self.rollout.prompts_per_step
        idx = shard_range(prompts, self.rank, self.world_size)

        def play_round(r: int) -> list[list[Episode]]:
            ids = [i + r * prompts for i in idx]
            seeds = [episode_seed(self.run_seed, step, i) for i in ids]
            sampling = [episode_seed(self.run_seed, step, i, 1) for i in ids]
            return worker.play(seeds, self.env.train_split, self.rollout.group_size, sampling_seeds=sampling)

        with phase("train.rollout"):
            return sample_with_signal(play_round, len(idx), self.rollout.dynamic_sampling_rounds)
