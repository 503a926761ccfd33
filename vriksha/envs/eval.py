"""`vriksha env eval NAME --model M --episodes N`: run a model through episodes and score it.

The episodes are played by `envs/play.py`, the loop the trainer's rollouts and held-out evaluation
run too: every turn, the prompts of all live episodes go to the engine as one batch of token ids,
each completion is one `EpisodeDriver.act`, and finished episodes drop out. Reports the mean reward
(train signal), the success rate (eval signal) and the mean of every reward component; with `samples` K,
each episode is played K more times at `sample_temperature` (one request with n = K) and pass@k and avg@K
are reported beside (`pass_at_k.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vriksha.envs.core import Environment
from vriksha.envs.episode import ActionShape
from vriksha.envs.pass_at_k import SampledScores, sampled_scores
from vriksha.envs.play import Episode, Sampling, play_groups
from vriksha.envs.registry import get_env_class
from vriksha.envs.trajectories import trajectory_row, write_trajectories
from vriksha.envs.transcript import PromptFormat

if TYPE_CHECKING:
    from vriksha import LLM

logger = logging.getLogger(__name__)

__all__ = ["EpisodeRecord", "EvalResult", "evaluate"]


@dataclass(slots=True)
class EpisodeRecord:
    seed: int
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    components: dict[str, float] = field(default_factory=dict)
    completions: list[str] = field(default_factory=list)
    truncated: bool = False

    @classmethod
    def of(cls, episode: Episode) -> EpisodeRecord:
        """The report's view of an episode (its scores and texts, not its token ids)."""
        e = episode
        return cls(e.seed, e.reward, e.success, e.turns, dict(e.components), list(e.completions), e.truncated)


@dataclass(slots=True)
class EvalResult:
    env: str
    model: str
    split: str
    episodes: int
    mean_reward: float
    success_rate: float
    components: dict[str, float]
    mean_turns: float
    duration_s: float
    generated_tokens: int
    records: list[EpisodeRecord] = field(default_factory=list)
    sampled: SampledScores | None = None  # with `samples` K: pass@k and avg@K

    def to_dict(self, with_records: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_records:
            d.pop("records")
        return d


def evaluate(
    env_name: str | type[Environment],
    llm: LLM,
    *,
    episodes: int = 16,
    split: str = "test",
    seed: int = 0,
    max_tokens: int = 256,
    temperature: float = 0.0,
    env_kwargs: dict[str, Any] | None = None,
    reset_options: dict[str, Any] | None = None,
    on_step: Callable[[], None] | None = None,
    progress: bool = True,
    model_name: str | None = None,
    max_turns: int | None = None,
    prompt_format: PromptFormat | None = None,
    samples: int = 0,
    sample_temperature: float = 1.0,
    save: str | Path | None = None,
) -> EvalResult:
    """Evaluate `llm` (a `vriksha.LLM`) on `episodes` episodes seeded `seed, seed+1, ...`.

    Each episode samples from its own seed; `max_turns` caps the environment's turn limit. `samples` K >= 1:
    each episode is also played K times at `sample_temperature` for pass@k and avg@K. `save`: every played
    episode (the K samples too) as a JSONL line there (`trajectories.py`).
    """
    if samples < 0 or (samples and sample_temperature <= 0):
        raise ValueError(
            f"samples: K >= 0 completions per episode at a sample temperature > 0 (got K={samples} at "
            f"{sample_temperature}); greedy samples would all be the same completion"
        )
    cls = get_env_class(env_name) if isinstance(env_name, str) else env_name
    shape = ActionShape.of(cls.action_type)
    if not (shape.takes_text or shape.takes_tool):
        raise ValueError(
            f"{cls.name}: its actions take neither `text` nor a `tool` call, so a language model cannot drive it"
        )
    started = time.monotonic()
    bar = _progress(episodes, f"{cls.name}", enabled=progress)

    def on_turn(finished: list[Episode]) -> None:
        bar.update(len(finished))
        if on_step is not None:  # one profiler step per turn: generation plus the environment steps
            on_step()

    seeds = [seed + i for i in range(episodes)]

    def play(
        group_size: int, temp: float, turn: Callable[[list[Episode]], None] | None
    ) -> list[list[Episode]]:
        if not episodes:
            return []
        return play_groups(
            llm,
            llm.tokenizer,
            lambda: cls(**(env_kwargs or {})),
            seeds,
            options={"split": split, **(reset_options or {})},
            group_size=group_size,
            sampling=Sampling(temperature=temp, max_tokens=max_tokens, logprobs=False),
            sampling_seeds=seeds,
            max_turns=max_turns,
            prompt_format=prompt_format,
            on_turn=turn,
        )

    groups = play(1, temperature, on_turn)
    bar.close()
    sampled = None
    drawn: list[list[Episode]] = []
    if samples and episodes:
        drawn = play(samples, sample_temperature, None)
        sampled = sampled_scores(
            [[e.success for e in g] for g in drawn],
            [[e.reward for e in g] for g in drawn],
            sample_temperature,
            sum(e.num_generated for g in drawn for e in g),
        )
    played = [g[0] for g in groups]
    name = model_name or str(getattr(llm, "model_name", None) or type(llm).__name__)
    if save is not None:
        rows = [
            trajectory_row(e, env=cls.name, model=name, split=split, sample=None, temperature=temperature)
            for e in played
        ]
        rows += [
            trajectory_row(e, env=cls.name, model=name, split=split, sample=k, temperature=sample_temperature)
            for g in drawn
            for k, e in enumerate(g)
        ]
        write_trajectories(save, rows)
    records = [EpisodeRecord.of(e) for e in played]
    tokens = sum(e.num_generated for e in played)
    n = max(1, len(records))
    keys = sorted({k for r in records for k in r.components})
    return EvalResult(
        env=cls.name,
        model=name,
        split=split,
        episodes=len(records),
        mean_reward=sum(r.reward for r in records) / n,
        success_rate=sum(r.success for r in records) / n,
        components={k: sum(r.components.get(k, 0.0) for r in records) / n for k in keys},
        mean_turns=sum(r.turns for r in records) / n,
        duration_s=time.monotonic() - started,
        generated_tokens=tokens,
        records=records,
        sampled=sampled,
    )


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"eval {desc}", unit="ep")
