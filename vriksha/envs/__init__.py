"""Verifiable RL environments: typed reset/step/state, rubrics, a sandbox, built-in tasks."""

from vriksha.envs.core import (
    Action,
    EnvError,
    Environment,
    EpisodeStateError,
    InvalidActionError,
    Observation,
    State,
    StepResult,
    TextAction,
    Tool,
    ToolCallAction,
    ToolError,
    ToolSpec,
    UnknownEnvironmentError,
)
from vriksha.envs.registry import get_env_class, list_envs, make_env, register_env
from vriksha.envs.rubrics import Criterion, Gate, Rubric, RubricScore, Sequence, TrajectoryRubric, WeightedSum
from vriksha.envs.sandbox import SandboxResult, SandboxUnavailableError, run_sandboxed

__all__ = [
    "Action",
    "Criterion",
    "Gate",
    "Rubric",
    "RubricScore",
    "SandboxResult",
    "SandboxUnavailableError",
    "Sequence",
    "TrajectoryRubric",
    "WeightedSum",
    "run_sandboxed",
    "EnvError",
    "Environment",
    "EpisodeStateError",
    "InvalidActionError",
    "Observation",
    "State",
    "StepResult",
    "TextAction",
    "Tool",
    "ToolCallAction",
    "ToolError",
    "ToolSpec",
    "UnknownEnvironmentError",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
]
