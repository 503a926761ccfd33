"""Training episodes through the engine, captured token for token.

The episodes are played by `vriksha.envs.play.play_groups` (the loop `vriksha env eval` runs too):
each group is one environment episode played `group_size` times, its first turn one engine request
with `n = group_size`; every turn goes through the environments' `EpisodeDriver`, and the token ids
are the engine's own (`Transcript`). This module turns what was played into the trainer's `Episode`s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vriksha.envs import make_env
from vriksha.envs.episode import EpisodeEnv
from vriksha.envs.play import Played, Sampling, play_groups
from vriksha.envs.protocol import EnvConnectionError, ErrorCode, RemoteEnvError
from vriksha.envs.transcript import PromptFormat
from vriksha.train.config import EnvConfig, RolloutConfig
from vriksha.train.remote_envs import RemoteEnvs

logger = logging.getLogger(__name__)

__all__ = ["Episode", "RolloutWorker"]

REPLAYS = 3  # plays of one batch repeated after an environment server was lost


@dataclass(slots=True)
class Episode:
    """One trajectory: what the model saw and produced, exactly as token ids, and how it scored."""

    group: int
    member: int  # index within the group
    seed: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    engine_logprobs: list[float] = field(default_factory=list)  # 0.0 on environment tokens
    loss_mask: list[int] = field(default_factory=list)  # 1 on generated tokens, 0 on environment tokens
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    success: bool = False
    turns: int = 0
    tool_calls: int = 0
    finish_reason: str | None = None
    text: str = ""  # the last turn's completion text (for logs)
    done: bool = False

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    @classmethod
    def from_played(cls, played: Played) -> Episode:
        t, o = played.transcript, played.outcome
        return cls(
            group=played.group,
            member=played.member,
            seed=played.seed,
            prompt_ids=list(t.prompt_ids),
            completion_ids=list(t.completion_ids),
            engine_logprobs=list(t.logprobs),
            loss_mask=list(t.loss_mask),
            reward=o.reward,
            components=dict(o.components),
            success=o.success,
            turns=o.turns,
            tool_calls=o.tool_calls,
            finish_reason=played.finish_reason,
            text=played.text,
            done=o.done,
        )


class RolloutWorker:
    """Plays episodes of one environment on an engine (`LLM`-shaped: `generate`, `eos_token_ids`)."""

    def __init__(self, llm: Any, tokenizer: Any, env_cfg: EnvConfig, cfg: RolloutConfig) -> None:
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
        return [[Episode.from_played(p) for p in g] for g in groups]

    def _play(
        self,
        seeds: Sequence[int],
        split: str,
        group_size: int,
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None,
    ) -> list[list[Played]]:
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
