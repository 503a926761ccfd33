"""The episode driver: how a model's turn becomes an environment step, in one place.

Every path that lets a model play an environment goes through `EpisodeDriver`: the trainer's rollouts
and held-out evaluation, `vriksha env eval` (both through `envs/play.py`), the TRL adapter, the
OpenEnv bridge and `vriksha env validate`. So the same environment, seed and model give the same
episode and the same score whichever path runs it.

    driver = EpisodeDriver(env, max_turns=4)
    first = driver.reset(seed=3, options={"split": "test"})
    while not driver.done:
        text = model(driver.reply or first.observation, stop=driver.stop)
        driver.act(text)
    driver.outcome.reward, driver.outcome.success, driver.outcome.components

The turn protocol (`act`):
- before the last turn, a tool call in the text (read by `tool_calls.find_tool_call`, over the one
  parser package `vriksha.toolcalls`; `tool_parser` names the convention)
  goes to the environment as its own action when the action type takes `tool` (a tool step), else to
  `call_tool` (an out-of-band call the model reads the answer of);
- otherwise the text is the action (`{"text": ...}`) when the action type takes `text`; an
  environment whose actions take neither ends the episode unscored;
- the episode ends when the environment says so or after `max_turns` turns (the driver's limit,
  else the environment's); the last turn's text is always the action, so it is scored;
- rewards add up over the steps; the typed `components` and `success` of the last step that
  reported them stand; every answered tool call counts once.

`ActionShape` is the only place that looks at an action type's fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from vriksha.envs.core import (
    Action,
    EnvError,
    EpisodeStateError,
    Observation,
    StepResult,
    StopConditions,
    ToolResult,
)
from vriksha.envs.tool_calls import ToolCall, find_tool_call
from vriksha.toolcalls import DEFAULT_PARSER

logger = logging.getLogger(__name__)

__all__ = ["ActionShape", "EpisodeDriver", "EpisodeEnv", "Outcome", "Reply", "answer_tool_call"]


@dataclass(frozen=True, slots=True)
class ActionShape:
    """Which fields an environment's actions take."""

    fields: frozenset[str]

    @classmethod
    def of(cls, action_type: type[Action]) -> ActionShape:
        return cls(frozenset(action_type.model_fields))

    @classmethod
    def from_schema(cls, schema: dict[str, Any]) -> ActionShape:
        """From the action's JSON schema (what a remote environment publishes)."""
        return cls(frozenset((schema or {}).get("properties", {})))

    @property
    def takes_text(self) -> bool:
        return "text" in self.fields

    @property
    def takes_tool(self) -> bool:
        return "tool" in self.fields

    def accepts(self, name: str) -> bool:
        return name in self.fields

    def text_action(self, text: str) -> dict[str, Any]:
        return {"text": text}

    def tool_action(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"tool": name, "arguments": arguments}


class EpisodeEnv(Protocol):
    """What the driver needs of an environment: a local `Environment` or a client of a remote one."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> StepResult: ...

    def step(self, action: Any) -> StepResult: ...

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str: ...


def answer_tool_call(env: EpisodeEnv, name: str, arguments: dict[str, Any]) -> ToolResult:
    """Call a tool out of band; a failing call is the model's mistake: it reads the error."""
    try:
        return ToolResult(name=name, arguments=dict(arguments), output=str(env.call_tool(name, arguments)))
    except Exception as exc:  # noqa: BLE001 (any tool failure becomes text the model reads)
        return ToolResult(name=name, arguments=dict(arguments), output=f"error: {exc}", error=True)


@dataclass(slots=True)
class Reply:
    """What the model is shown next: the environment's answer, as a chat message."""

    role: str  # "user" (an environment's answer to text) or "tool" (a tool's answer)
    content: str


@dataclass(slots=True)
class Outcome:
    """How one episode went, accumulated over its turns."""

    seed: int | None = None
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    success: bool = False
    turns: int = 0
    tool_calls: int = 0
    truncated: bool = False
    done: bool = False
    completions: list[str] = field(default_factory=list)  # the model's text, one per turn


class EpisodeDriver:
    """Plays one episode of `env`, one model turn at a time."""

    def __init__(
        self,
        env: EpisodeEnv,
        *,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        shape: ActionShape | None = None,
        tool_parser: str = DEFAULT_PARSER,
    ) -> None:
        for label, value in (("max_turns", max_turns), ("max_tokens", max_tokens)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise EnvError(f"EpisodeDriver: {label} must be a positive integer or None, got {value!r}")
        if shape is None:
            action_type = getattr(env, "action_type", None)
            if action_type is None:
                raise EnvError("EpisodeDriver: pass `shape=` for an environment without an `action_type`")
            shape = ActionShape.of(action_type)
        self.env = env
        self.shape = shape
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.tool_parser = tool_parser
        self.outcome = Outcome()
        self.observation: Observation | None = None
        self.reply: Reply | None = None
        self._env_max_turns: int | None = None
        self._tool_names: frozenset[str] = frozenset()

    # -- the episode ---------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> StepResult:
        first = self.env.reset(seed=seed, options=options)
        self.outcome = Outcome(seed=seed)
        self.observation = first.observation
        self.reply = None
        self._env_max_turns = first.observation.stop.max_turns or getattr(self.env, "max_turns", None)
        self._tool_names = frozenset(t.name for t in first.observation.tools)
        return first

    @property
    def done(self) -> bool:
        return self.outcome.done

    @property
    def turn_limit(self) -> int | None:
        """Turns at most: the driver's `max_turns`, else the environment's (its steps; it enforces those)."""
        return self.max_turns if self.max_turns is not None else self._env_max_turns

    @property
    def stop(self) -> StopConditions:
        """When the next turn ends: the environment's stop strings and ids, the lower token cap."""
        asked = self.observation.stop if self.observation is not None else StopConditions()
        caps = [x for x in (asked.max_tokens, self.max_tokens) if x is not None]
        return StopConditions(
            strings=list(asked.strings),
            token_ids=list(asked.token_ids),
            max_tokens=min(caps) if caps else None,
            max_turns=self.turn_limit,
        )

    def act(self, text: str) -> StepResult:
        """Apply one model turn (its text) and return the environment's answer."""
        self._check_live()
        out = self.outcome
        last = self.turn_limit is not None and out.turns + 1 >= self.turn_limit
        call = None if last else self._tool_call(text)
        if call is not None and self.shape.takes_tool:
            result = self._take(self.env.step(self.shape.tool_action(call.name, call.arguments)), "tool", 1)
        elif call is not None:
            result = self._answer_out_of_band(call.name, call.arguments, model_turn=True)
        elif self.shape.takes_text:
            result = self._take(self.env.step(self.shape.text_action(text)), "user", 0)
        else:  # actions take no text and the model called no tool: nothing to score
            out.turns += 1
            out.done, self.reply = True, None
            result = StepResult(observation=Observation(), truncated=True)
        out.completions.append(text)
        return result

    def step(self, action: Action | dict[str, Any]) -> StepResult:
        """Apply an action given as such (not model text)."""
        self._check_live()
        is_tool = isinstance(action, dict) and "tool" in action and self.shape.takes_tool
        return self._take(self.env.step(action), "tool" if is_tool else "user", int(is_tool))

    def tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        """A tool call the agent made itself (not through `act`): a tool step when the action type takes
        `tool`, else an out-of-band `call_tool` (which does not count as a turn)."""
        self._check_live()
        if self.shape.takes_tool:
            return self._take(self.env.step(self.shape.tool_action(name, arguments)), "tool", 1)
        return self._answer_out_of_band(name, dict(arguments), model_turn=False)

    # -- inside ---------------------------------------------------------------

    def _tool_call(self, text: str) -> ToolCall | None:
        if not (self.shape.takes_tool or self._tool_names):
            return None
        return find_tool_call(text, self.tool_parser)

    def _answer_out_of_band(self, name: str, arguments: dict[str, Any], model_turn: bool) -> StepResult:
        """`call_tool`, not a step: the environment's turn count stays; a model's turn counts here."""
        answered = answer_tool_call(self.env, name, arguments)
        self.outcome.tool_calls += 1
        self.observation = Observation(
            text=answered.output, stop=self.observation.stop, tool_results=[answered]
        )
        result = StepResult(observation=self.observation)
        if not model_turn:
            self.reply = Reply("tool", answered.output)
            return result
        self.outcome.turns += 1
        return self._after(result, Reply("tool", answered.output))

    def _take(self, result: StepResult, role: str, tool_steps: int) -> StepResult:
        out = self.outcome
        out.turns += 1
        out.reward += float(result.reward)
        if result.components:
            out.components = {k: float(v) for k, v in result.components.items()}
        if result.success is not None:
            out.success = bool(result.success)
        out.tool_calls += max(tool_steps, len(result.observation.tool_results))
        self.observation = result.observation
        if result.done:
            out.done, out.truncated = True, result.truncated
            self.reply = None
            return result
        return self._after(result, Reply(role, result.observation.text))

    def _after(self, result: StepResult, reply: Reply) -> StepResult:
        out = self.outcome
        if self.turn_limit is not None and out.turns >= self.turn_limit:
            out.done, out.truncated = True, True
            self.reply = None
        else:
            self.reply = reply
        return result

    def _check_live(self) -> None:
        if self.observation is None:
            raise EpisodeStateError("EpisodeDriver: call reset() before playing a turn")
        if self.outcome.done:
            raise EpisodeStateError("EpisodeDriver: the episode has ended; reset() to start another")
