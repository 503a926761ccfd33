"""The environment contract: typed actions and observations, `reset`/`step`/`state`, tools.

Invariants (tested in `tests/envs/test_core.py` and checked by `vriksha env validate`):
- the same seed (and options) gives the same episode;
- observations, state and tool answers never carry ground truth: that stays in private attributes;
- every scored step carries typed `components` ({name: float}) and `success` (bool) on its `StepResult`;
- `reward` is the train-time signal, `success` the eval-time one;
- what a driver needs to play a turn is typed on the `Observation`: `stop` (stop strings, stop token
  ids, tokens per turn, the episode's turn limit) and `tool_results` (the tool calls this step answered).
  `metadata` and `info` are free-form extras for people and logs; no driver reads a key of them.

A subclass sets `name` (and `action_type` and friends when it needs other types) and implements
`_reset(seed, options)` and `_step(action)`; the public `reset`/`step` do the bookkeeping:
seeding, episode ids, step counting, validation of dict actions, the turn limit, and refusing
steps after the episode ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import uuid
from abc import ABC
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vriksha.errors import VrikshaError

logger = logging.getLogger(__name__)

__all__ = [
    "Action",
    "TextAction",
    "ToolCallAction",
    "ToolSpec",
    "Tool",
    "StopConditions",
    "ToolResult",
    "Observation",
    "StepResult",
    "State",
    "Environment",
    "EnvError",
    "InvalidActionError",
    "EpisodeStateError",
    "UnknownEnvironmentError",
    "ToolError",
]


def phase(name: str) -> contextlib.AbstractContextManager:
    """`vriksha.profiling.phase` when torch is loaded (a profiler can only be running then), else a no-op;
    keeps `import vriksha.envs` free of torch."""
    if "torch" not in sys.modules:
        return contextlib.nullcontext()
    try:
        from vriksha.profiling import phase as _phase
    except ImportError:
        return contextlib.nullcontext()
    return _phase(name)


# ---------------------------------------------------------------- errors


class EnvError(VrikshaError):
    """Something about an environment or an episode went wrong."""


class InvalidActionError(EnvError, ValueError):
    """An action failed validation against the environment's action type."""


class EpisodeStateError(EnvError, RuntimeError):
    """`step` before `reset`, after the episode ended, or after `close`."""


class UnknownEnvironmentError(EnvError, KeyError):
    """No environment is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ToolError(EnvError, ValueError):
    """A tool name is unknown or its arguments are invalid."""


# ---------------------------------------------------------------- wire types


class Action(BaseModel):
    """Base of every action; subclasses add fields. Unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid")


class TextAction(Action):
    """The common case: the model's free-text answer."""

    text: str


class ToolCallAction(Action):
    """A call of one of the episode's tools."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(BaseModel):
    """A tool as the agent sees it: name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class StopConditions(BaseModel):
    """When the model's next turn ends, as the environment asks (the driver adds its own caps)."""

    model_config = ConfigDict(extra="forbid")

    strings: list[str] = Field(default_factory=list, description="stop after any of these (kept in the turn)")
    token_ids: list[int] = Field(default_factory=list, description="stop after any of these token ids")
    max_tokens: int | None = Field(None, ge=1, description="tokens per turn at most")
    max_turns: int | None = Field(None, ge=1, description="the episode's turn limit (set by `Environment`)")


class ToolResult(BaseModel):
    """One tool call the environment answered in this step (a failed call too: `error` is set)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: str = ""
    error: bool = False


class Observation(BaseModel):
    """What the agent sees. Never ground truth."""

    text: str = ""
    messages: list[dict[str, Any]] | None = None
    tools: list[ToolSpec] = Field(default_factory=list)
    stop: StopConditions = Field(default_factory=StopConditions)
    tool_results: list[ToolResult] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class StepResult(BaseModel):
    """An environment's answer to `reset` or `step`. A scored step sets `components` and `success`."""

    observation: Observation
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    components: dict[str, float] = Field(default_factory=dict)
    success: bool | None = None
    info: dict[str, Any] = Field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class State(BaseModel):
    """Public episode state; environments subclass it to add public (never secret) fields."""

    episode_id: str
    step_count: int = 0
    seed: int | None = None
    split: str = "train"
    done: bool = False


@dataclass(slots=True)
class Tool:
    """A tool an environment offers: its spec plus the Python callable that answers it."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = field(repr=False)

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


def _check_tool_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    if not isinstance(arguments, dict):
        raise ToolError(
            f"tool {tool.name!r}: arguments must be a JSON object, got {type(arguments).__name__}"
        )
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
    if missing:
        raise ToolError(
            f"tool {tool.name!r}: missing required argument(s) {missing}; it takes {sorted(props)}"
        )
    if tool.parameters.get("additionalProperties", True) is False:
        extra = sorted(set(arguments) - set(props))
        if extra:
            raise ToolError(f"tool {tool.name!r}: unknown argument(s) {extra}; it takes {sorted(props)}")
    types: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "object": dict,
        "array": list,
    }
    for key, value in arguments.items():
        want = types.get(props.get(key, {}).get("type", ""))
        if want is not None and not isinstance(value, want):
            raise ToolError(
                f"tool {tool.name!r}: argument {key!r} must be {props[key]['type']}, got {value!r}"
            )


# ---------------------------------------------------------------- the environment


class Environment(ABC):  # noqa: B024 (subclasses implement _reset/_step)
    """Gymnasium-shaped environment with typed actions; one instance is one session."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    action_type: ClassVar[type[Action]] = TextAction
    observation_type: ClassVar[type[Observation]] = Observation
    state_type: ClassVar[type[State]] = State
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    max_turns: ClassVar[int] = 1
    runs_untrusted_code: ClassVar[bool] = False  # True: it executes agent code in the sandbox

    def __init__(self, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no options {sorted(kwargs)}")
        self._state: State | None = None
        self._closed = False

    # -- to implement ------------------------------------------------------

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation | StepResult:
        """Start an episode from `seed` (use `random.Random(seed)`, never global randomness)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _reset(seed, options)")

    def _step(self, action: Action) -> StepResult:
        """Apply one validated action; report reward, components and success in `info`."""
        raise NotImplementedError(f"{type(self).__name__} must implement _step(action)")

    def _make_state(self, episode_id: str, seed: int, split: str) -> State:
        return self.state_type(episode_id=episode_id, seed=seed, split=split)

    # -- the public API ------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> StepResult:
        self._check_open()
        options = dict(options or {})
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise InvalidActionError(f"seed must be a non-negative integer, got {seed!r}")
        split = options.get("split", "train")
        if split not in self.splits:
            raise InvalidActionError(
                f"unknown split {split!r} for {self.name!r}; choose one of {list(self.splits)}"
            )
        self._state = self._make_state(uuid.uuid4().hex, seed, split)
        out = self._reset(seed, options)
        result = out if isinstance(out, StepResult) else StepResult(observation=out)
        if not result.observation.tools:
            result.observation.tools = [t.spec() for t in self.tools()]
        self._mark_turn_limit(result)
        return result

    def step(self, action: Action | dict[str, Any]) -> StepResult:
        self._check_open()
        if self._state is None:
            raise EpisodeStateError(f"{self.name}: call reset() before step()")
        if self._state.done:
            raise EpisodeStateError(f"{self.name}: the episode has ended; call reset() to start another")
        parsed = self.parse_action(action)
        self._state.step_count += 1
        with phase("env.step"):
            result = self._step(parsed)
        if not result.done and self._state.step_count >= self.max_turns:
            result.truncated = True
        self._state.done = result.done
        self._mark_turn_limit(result)
        return result

    def _mark_turn_limit(self, result: StepResult) -> None:
        if result.observation.stop.max_turns is None:
            result.observation.stop.max_turns = self.max_turns

    def parse_action(self, action: Action | dict[str, Any]) -> Action:
        """Validate a dict (or foreign Action) into `action_type`; errors name the problem."""
        if isinstance(action, self.action_type):
            return action
        if isinstance(action, BaseModel):
            action = action.model_dump()
        if not isinstance(action, dict):
            raise InvalidActionError(
                f"{self.name}: an action must be a JSON object matching {self.action_type.__name__}, "
                f"got {type(action).__name__}"
            )
        try:
            return self.action_type.model_validate(action)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'action'}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidActionError(
                f"{self.name}: invalid {self.action_type.__name__} ({problems}); "
                f"schema: {self.action_type.model_json_schema()}"
            ) from None

    @property
    def state(self) -> State:
        if self._state is None:
            raise EpisodeStateError(f"{self.name}: no episode yet; call reset() first")
        return self._state

    def tools(self) -> list[Tool]:
        return []

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        self._check_open()
        arguments = {} if arguments is None else arguments
        by_name = {t.name: t for t in self.tools()}
        if name not in by_name:
            raise ToolError(f"{self.name}: unknown tool {name!r}; available: {sorted(by_name) or 'none'}")
        tool = by_name[name]
        _check_tool_arguments(tool, arguments)
        return str(tool.fn(**arguments))

    async def areset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> StepResult:
        return await asyncio.to_thread(self.reset, seed, options)

    async def astep(self, action: Action | dict[str, Any]) -> StepResult:
        return await asyncio.to_thread(self.step, action)

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeStateError(f"{self.name}: the environment is closed; make a new one")

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def schemas(cls) -> dict[str, Any]:
        return {
            "action": cls.action_type.model_json_schema(),
            "observation": cls.observation_type.model_json_schema(),
            "state": cls.state_type.model_json_schema(),
        }

    @classmethod
    def metadata(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "description": cls.description or next(iter((cls.__doc__ or "").strip().splitlines()), ""),
            "action_type": cls.action_type.__name__,
            "observation_type": cls.observation_type.__name__,
            "splits": list(cls.splits),
            "max_turns": cls.max_turns,
            "schemas": cls.schemas(),
        }
