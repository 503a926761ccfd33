"""What one training step measured, as a typed record: each rank fills in its share, the shares are
combined across ranks as float64 tensors (one all-reduce of the sums, one of the maxima, one of the
squared deviations from the step's mean reward), and the total becomes the step's row of `metrics.jsonl`.

Named sums whose names the ranks need not share (reward components; the loss's metrics) are laid out
on the union of the ranks' names first. Peak memory is per rank: it is gathered, not combined.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist

from vriksha.envs.play import Episode
from vriksha.train.distributed import all_gather_floats, all_reduce
from vriksha.train.update import UpdateResult

__all__ = ["StepMetrics"]

MEMORY_KEYS = ("peak_rss_gb", "device_peak_gb")


def _sum(default: float = 0) -> Any:
    return field(default=default, metadata={"reduce": "sum"})


def _max() -> Any:
    return field(default=-math.inf, metadata={"reduce": "max"})


def _min() -> Any:
    return field(default=math.inf, metadata={"reduce": "min"})


@dataclass(slots=True)
class StepMetrics:
    episodes: int = _sum()
    reward: float = _sum(0.0)
    reward_deviation: float = 0.0  # sum of squared differences from the step's mean reward (set by reduce)
    successes: int = _sum()
    completion_tokens: int = _sum()
    truncated: int = _sum()
    turns: int = _sum()
    tool_calls: int = _sum()
    advantages: int = _sum()  # how many the update trained on (the groups with signal)
    advantage_sum: float = _sum(0.0)
    advantage_squares: float = _sum(0.0)
    groups: int = _sum()
    zero_variance_groups: int = _sum()
    played_groups: int = _sum()  # by dynamic sampling, the discarded ones included
    played_with_signal: int = _sum()
    loss: float = _sum(0.0)
    loss_tokens: float = _sum(0.0)  # the generated tokens the loss metrics are summed over
    entropy: float = _sum(0.0)
    completion_tokens_max: float = _max()
    advantage_max: float = _max()
    advantage_min: float = _min()
    sync_s: float = _max()
    rollout_s: float = _max()
    train_s: float = _max()
    components: dict[str, float] = field(default_factory=dict)  # summed over episodes
    loss_metrics: dict[str, float] = field(default_factory=dict)  # summed over generated tokens
    memory: list[dict[str, float]] = field(default_factory=list)  # one per rank, in rank order
    rewards: list[float] = field(default_factory=list)  # this rank's, for the deviations from the step's mean

    @classmethod
    def of_rank(
        cls,
        episodes: Sequence[Episode],
        advantages: Sequence[float],
        update: UpdateResult,
        *,
        groups: int,
        zero_variance_groups: int,
        played_groups: int,
        played_with_signal: int,
        seconds: tuple[float, float, float],
        memory: dict[str, float],
    ) -> StepMetrics:
        """This rank's share: the episodes it played, the advantages it trained on, its update's sums,
        its (sync, rollout, train) seconds and its peak memory."""
        lengths = [e.num_generated for e in episodes]
        components: dict[str, float] = {}
        for e in episodes:
            for k, v in e.components.items():
                components[k] = components.get(k, 0.0) + v
        return cls(
            episodes=len(episodes),
            reward=sum(e.reward for e in episodes),
            successes=sum(e.success for e in episodes),
            completion_tokens=sum(lengths),
            truncated=sum(e.finish_reason == "length" for e in episodes),
            turns=sum(e.turns for e in episodes),
            tool_calls=sum(e.tool_calls for e in episodes),
            advantages=len(advantages),
            advantage_sum=sum(advantages),
            advantage_squares=sum(a * a for a in advantages),
            groups=groups,
            zero_variance_groups=zero_variance_groups,
            played_groups=played_groups,
            played_with_signal=played_with_signal,
            loss=update.loss,
            loss_tokens=update.tokens,
            entropy=update.entropy_sum,
            completion_tokens_max=max(lengths, default=-math.inf),
            advantage_max=max(advantages, default=-math.inf),
            advantage_min=min(advantages, default=math.inf),
            sync_s=seconds[0],
            rollout_s=seconds[1],
            train_s=seconds[2],
            components=components,
            loss_metrics=dict(update.metrics),
            memory=[dict(memory)],
            rewards=[e.reward for e in episodes],
        )

    # -- across ranks ------------------------------------------------------------------------------

    def reduce(self, device: torch.device | None = None) -> StepMetrics:
        """The step's totals over every rank of the default group (each rank gets them)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            total = copy.copy(self)
            total.reward_deviation = self._deviation(self.reward / self.episodes)
            return total
        names = self._names_on_every_rank()
        sums, maxima = self._pack(*names)
        memory = [
            {k: v for k, v in zip(MEMORY_KEYS, row, strict=True) if not math.isnan(v)}
            for row in all_gather_floats([self.memory[0].get(k, math.nan) for k in MEMORY_KEYS], device)
        ]
        total = _unpack(all_reduce(sums, "sum", device), all_reduce(maxima, "max", device), *names, memory)
        (total.reward_deviation,) = all_reduce(
            [self._deviation(total.reward / total.episodes)], "sum", device
        )
        return total

    @classmethod
    def merge(cls, parts: Sequence[StepMetrics]) -> StepMetrics:
        """What `reduce` gives when the ranks' shares are `parts` (in rank order)."""
        names = (
            sorted({k for p in parts for k in p.components}),
            list(dict.fromkeys(k for p in parts for k in p.loss_metrics)),
        )
        packed = [p._pack(*names) for p in parts]
        sums = [sum(col) for col in zip(*(s for s, _ in packed), strict=True)]
        maxima = [max(col) for col in zip(*(m for _, m in packed), strict=True)]
        total = _unpack(sums, maxima, *names, [m for p in parts for m in p.memory])
        total.reward_deviation = sum(p._deviation(total.reward / total.episodes) for p in parts)
        return total

    def _deviation(self, mean: float) -> float:
        return sum((r - mean) ** 2 for r in self.rewards)

    def _names_on_every_rank(self) -> tuple[list[str], list[str]]:
        """The union of every rank's component and loss-metric names (the keys alone travel as objects)."""
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (sorted(self.components), list(self.loss_metrics)))
        components = sorted({k for c, _ in parts for k in c})
        loss_metrics = list(dict.fromkeys(k for _, m in parts for k in m))  # the loss's order
        return components, loss_metrics

    def _pack(self, components: list[str], loss_metrics: list[str]) -> tuple[list[float], list[float]]:
        """(sums, maxima) as floats: the sum fields then the named sums; the max fields, then the min
        fields negated."""
        sums = [float(getattr(self, f.name)) for f in fields(self) if f.metadata.get("reduce") == "sum"]
        sums += [self.components.get(k, 0.0) for k in components]
        sums += [self.loss_metrics.get(k, 0.0) for k in loss_metrics]
        maxima = [float(getattr(self, f.name)) for f in fields(self) if f.metadata.get("reduce") == "max"]
        maxima += [-float(getattr(self, f.name)) for f in fields(self) if f.metadata.get("reduce") == "min"]
        return sums, maxima

    # -- the row -------------------------------------------------------------------------------------

    def row(self, step: int, grad_norm: float, lr: float, step_s: float) -> dict[str, Any]:
        """The step's line of `metrics.jsonl` (per-token means over the loss's tokens, per-episode means,
        the slowest rank's seconds)."""
        n = self.episodes
        mean = self.reward / n

        def per_token(total: float) -> float:
            return total / self.loss_tokens if self.loss_tokens else 0.0

        k = self.advantages
        row: dict[str, Any] = {
            "step": step,
            "reward/mean": mean,
            "reward/std": (self.reward_deviation / n) ** 0.5,
            "success_rate": self.successes / n,
        }
        for name, total in sorted(self.components.items()):
            row[f"reward/{name}"] = total / n
        row.update(
            {
                "groups/total": self.groups,
                "groups/zero_variance": self.zero_variance_groups,
                "groups/played": self.played_groups,
                "groups/played_with_signal": self.played_with_signal,
                "advantage/mean": self.advantage_sum / k if k else 0.0,
                "advantage/std": (self.advantage_squares / k) ** 0.5 if k else 0.0,
                "advantage/min": self.advantage_min if k else 0.0,
                "advantage/max": self.advantage_max if k else 0.0,
                "loss": self.loss,
            }
        )
        for name, total in self.loss_metrics.items():
            row[name] = per_token(total)
        row.update(
            {
                "entropy": per_token(self.entropy),
                "grad_norm": grad_norm,
                "lr": lr,
                "completion_tokens/mean": self.completion_tokens / n,
                "completion_tokens/max": int(self.completion_tokens_max),
                "completion_tokens/truncated_fraction": self.truncated / n,
                "turns/mean": self.turns / n,
                "tool_calls/mean": self.tool_calls / n,
                "time/sync_s": self.sync_s,
                "time/rollout_s": self.rollout_s,
                "time/train_s": self.train_s,
                "time/step_s": step_s,
                "perf/tokens_per_s": self.completion_tokens / step_s if step_s > 0 else 0.0,
                "perf/steps_per_hour": 3600.0 / step_s if step_s > 0 else 0.0,
            }
        )
        for rank, memory in enumerate(self.memory):
            for key, value in memory.items():
                row[f"memory/rank{rank}_{key}"] = value
        return row


def _unpack(
    sums: list[float],
    maxima: list[float],
    components: list[str],
    loss_metrics: list[str],
    memory: list[dict[str, float]],
) -> StepMetrics:
    out = StepMetrics(memory=memory)
    summed = [f for f in fields(out) if f.metadata.get("reduce") == "sum"]
    for f, value in zip(summed, sums, strict=False):
        setattr(out, f.name, int(value) if isinstance(f.default, int) else value)
    rest = iter(sums[len(summed) :])
    out.components = {k: next(rest) for k in components}
    out.loss_metrics = {k: next(rest) for k in loss_metrics}
    largest = [f for f in fields(out) if f.metadata.get("reduce") == "max"]
    smallest = [f for f in fields(out) if f.metadata.get("reduce") == "min"]
    for f, value in zip(largest + smallest, maxima, strict=True):
        setattr(out, f.name, value if f in largest else -value)
    return out
