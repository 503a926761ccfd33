"""Composable reward logic with named components.

A rubric maps (episode, action) to a `RubricScore`: the train-time `total`, the named
`components` (each in [0, 1] unless documented otherwise) and the eval-time `success`.

    rubric = Gate(
        Criterion("length_ok", lambda ep, a: len(a) <= 4000),
        WeightedSum({"correct": (Criterion("correct", is_correct), 0.9),
                     "format": (Criterion("format", has_format), 0.1)}, success="correct"),
    )

- `Criterion`: a leaf; a function returning a float in [0, 1] (or a bool).
- `WeightedSum`: weighted sum of child totals; success from a named child or all children.
- `Gate`: the inner rubric counts only when the gate passes; otherwise the total is 0 and the
  components are still reported (so a failed format gate is visible in the logs).
- `Sequence`: ordered stages (compiles -> runs -> passes); scoring stops at the first stage that
  fails; later stages report 0.
- `TrajectoryRubric`: scores a whole episode from its per-step scores and the episode itself.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vriksha.envs.core import Observation, StepResult, phase

logger = logging.getLogger(__name__)

__all__ = ["RubricScore", "Rubric", "Criterion", "WeightedSum", "Gate", "Sequence", "TrajectoryRubric"]


@dataclass(slots=True)
class RubricScore:
    total: float
    components: dict[str, float] = field(default_factory=dict)
    success: bool = False

    def result(
        self,
        observation: Observation,
        *,
        terminated: bool = True,
        truncated: bool = False,
        info: dict[str, Any] | None = None,
    ) -> StepResult:
        """The scored step: reward `total`, typed `components` and `success`."""
        return StepResult(
            observation=observation,
            reward=self.total,
            terminated=terminated,
            truncated=truncated,
            components=dict(self.components),
            success=bool(self.success),
            info=dict(info or {}),
        )


class Rubric(ABC):
    name: str = "rubric"

    @abstractmethod
    def score(self, episode: Any, action: Any) -> RubricScore: ...

    def __call__(self, episode: Any, action: Any) -> RubricScore:
        with phase("env.reward"):
            return self.score(episode, action)


def _as_float(value: float | bool | None, name: str) -> float:
    if value is None:
        return 0.0
    x = float(value)
    if math.isnan(x):
        logger.warning("criterion %s returned NaN; scoring 0", name)
        return 0.0
    return x


class Criterion(Rubric):
    """A leaf: `fn(episode, action) -> float | bool`; success when the value reaches `threshold`.

    A criterion that raises scores 0 (and logs the error): a reward function must never crash a
    rollout because the model wrote something odd.
    """

    def __init__(self, name: str, fn: Callable[[Any, Any], float | bool | None], threshold: float = 1.0):
        self.name, self.fn, self.threshold = name, fn, threshold

    def score(self, episode: Any, action: Any) -> RubricScore:
        try:
            value = _as_float(self.fn(episode, action), self.name)
        except Exception as exc:
            logger.debug("criterion %s raised %r; scoring 0", self.name, exc)
            value = 0.0
        return RubricScore(value, {self.name: value}, value >= self.threshold)


def _merge(into: dict[str, float], comps: Mapping[str, float], owner: str) -> None:
    for key, value in comps.items():
        if key in into and into[key] != value:  # the same criterion seen through two branches is fine
            raise ValueError(
                f"{owner}: component name {key!r} appears twice; give the criteria distinct names"
            )
        into[key] = value


class WeightedSum(Rubric):
    """total = sum(weight_i * total_i); success from child `success` (a name) or all children."""

    def __init__(
        self, parts: Mapping[str, tuple[Rubric, float]], success: str | None = None, name: str = "sum"
    ):
        if success is not None and success not in parts:
            raise ValueError(f"{name}: success={success!r} is not one of the parts {sorted(parts)}")
        self.parts, self.success_from, self.name = dict(parts), success, name

    def score(self, episode: Any, action: Any) -> RubricScore:
        total, comps, successes = 0.0, {}, {}
        for key, (rubric, weight) in self.parts.items():
            s = rubric.score(episode, action)
            total += weight * s.total
            _merge(comps, s.components, self.name)
            successes[key] = s.success
        ok = successes[self.success_from] if self.success_from else all(successes.values())
        return RubricScore(total, comps, ok)


class Gate(Rubric):
    """`inner` counts only if `gate` reaches `threshold`; components of both are reported."""

    def __init__(self, gate: Rubric, inner: Rubric, threshold: float = 1.0, name: str = "gate"):
        self.gate, self.inner, self.threshold, self.name = gate, inner, threshold, name

    def score(self, episode: Any, action: Any) -> RubricScore:
        g = self.gate.score(episode, action)
        inner = self.inner.score(episode, action)
        comps: dict[str, float] = {}
        _merge(comps, g.components, self.name)
        _merge(comps, inner.components, self.name)
        if g.total < self.threshold:
            return RubricScore(0.0, comps, False)
        return RubricScore(inner.total, comps, inner.success)


class Sequence(Rubric):
    """Ordered stages with weights; stops at the first stage whose total is below its threshold.

    Later stages are not run (their components report 0), which matters when a stage is expensive
    (running tests after the code failed to compile).
    """

    def __init__(self, stages: list[tuple[Rubric, float, float]], name: str = "sequence"):
        """`stages`: (rubric, weight, pass threshold)."""
        self.stages, self.name = stages, name

    def score(self, episode: Any, action: Any) -> RubricScore:
        total, comps, ok = 0.0, {}, True
        for rubric, weight, threshold in self.stages:
            if not ok:
                _merge(comps, {rubric.name: 0.0}, self.name)
                continue
            s = rubric.score(episode, action)
            total += weight * s.total
            _merge(comps, s.components, self.name)
            ok = s.total >= threshold and s.success
        return RubricScore(total, comps, ok)


class TrajectoryRubric(Rubric):
    """Scores a whole episode: `action` is the list of per-step actions (the trajectory).

    `final` scores the episode's outcome (e.g. the last answer); `shaping` optional criteria over
    the whole trajectory (tool use, turn count) added with their weights; `gate` names a shaping
    component that must be 1 for anything to count (e.g. "the tool was used").
    """

    def __init__(
        self,
        final: Rubric,
        shaping: Mapping[str, tuple[Rubric, float]] | None = None,
        final_weight: float = 1.0,
        gate: str | None = None,
        name: str = "trajectory",
    ):
        self.final, self.shaping, self.final_weight = final, dict(shaping or {}), final_weight
        if gate is not None and gate not in self.shaping:
            raise ValueError(f"{name}: gate={gate!r} is not one of the shaping parts {sorted(self.shaping)}")
        self.gate, self.name = gate, name

    def score(self, episode: Any, action: Any) -> RubricScore:
        trajectory = list(action)
        last = trajectory[-1] if trajectory else None
        f = self.final.score(episode, last)
        total, comps = self.final_weight * f.total, dict(f.components)
        gate_ok = True
        for key, (rubric, weight) in self.shaping.items():
            s = rubric.score(episode, trajectory)
            total += weight * s.total
            _merge(comps, s.components, self.name)
            if key == self.gate:
                gate_ok = s.total >= 1.0
        if not gate_ok:
            return RubricScore(0.0, comps, False)
        return RubricScore(total, comps, f.success)
