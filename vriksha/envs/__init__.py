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

__all__ = [
    "Action",
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
