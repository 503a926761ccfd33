"""The episode driver's turn protocol: tool steps, out-of-band tool calls, the last turn, the score."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import model_validator

from vriksha.envs import (
    Action,
    ActionShape,
    Environment,
    EpisodeDriver,
    EpisodeStateError,
    Observation,
    StepResult,
    StopConditions,
    TextAction,
    Tool,
    ToolCallAction,
    ToolResult,
    make_env,
)

CALL = '<tool_call>{"name": "double", "arguments": {"x": 21}}</tool_call>'
DOUBLE = Tool(
    "double",
    "Double a number.",
    {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    fn=lambda x: 2 * x,
)


class EitherAction(Action):
    text: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] = {}

    @model_validator(mode="after")
    def _one(self) -> EitherAction:
        if (self.text is None) == (self.tool is None):
            raise ValueError("text or tool")
        return self


class ToolStepEnv(Environment):
    """Tool calls are steps; a text answer ends the episode, scored by how many calls came first."""

    name = "test_tool_steps"
    action_type = EitherAction
    max_turns = 5

    def _reset(self, seed, options):
        self._calls = 0
        return Observation(text="go", stop=StopConditions(strings=["</tool_call>"], max_tokens=12))

    def _step(self, action):
        if getattr(action, "tool", None) is not None:
            self._calls += 1
            out = self.call_tool(action.tool, action.arguments)
            called = ToolResult(name=action.tool, arguments=action.arguments, output=out)
            return StepResult(observation=Observation(text=out, tool_results=[called]), reward=0.1)
        return StepResult(
            observation=Observation(),
            reward=0.5,
            terminated=True,
            components={"calls": float(self._calls)},
            success=self._calls > 0,
        )

    def tools(self):
        return [DOUBLE]


class TextWithToolsEnv(ToolStepEnv):
    """Text actions only; tools only through `call_tool`."""

    name = "test_text_tools"
    action_type = TextAction


class ToolOnlyEnv(ToolStepEnv):
    name = "test_tool_only"
    action_type = ToolCallAction


def test_action_shape_from_type_and_schema():
    shape = ActionShape.of(EitherAction)
    assert shape.takes_text and shape.takes_tool and shape.accepts("arguments") and not shape.accepts("type")
    assert ActionShape.from_schema(EitherAction.model_json_schema()) == shape


def test_a_tool_call_reaches_an_env_whose_actions_take_tools_as_a_tool_step():
    env = ToolStepEnv()
    driver = EpisodeDriver(env, max_turns=4, max_tokens=32)
    driver.reset(seed=1)
    assert driver.stop.strings == ["</tool_call>"] and driver.stop.max_tokens == 12
    r = driver.act(f"let me see {CALL}")
    assert not r.done and r.observation.text == "42" and env.state.step_count == 1
    assert driver.reply.role == "tool" and driver.reply.content == "42"
    r = driver.act("Answer: 42")
    assert r.terminated and driver.done and driver.reply is None
    out = driver.outcome
    assert (out.turns, out.tool_calls, out.success, out.components) == (2, 1, True, {"calls": 1.0})
    assert out.reward == pytest.approx(0.6) and out.completions == [f"let me see {CALL}", "Answer: 42"]
    with pytest.raises(EpisodeStateError, match="ended"):
        driver.act("more")


def test_the_last_turn_is_always_the_text_and_is_scored():
    driver = EpisodeDriver(ToolStepEnv(), max_turns=2)
    driver.reset(seed=1)
    driver.act(CALL)
    r = driver.act(CALL)  # the last turn: the call is not parsed, the text is the answer
    assert r.terminated and driver.outcome.turns == 2 and driver.outcome.tool_calls == 1


def test_text_env_with_tools_answers_calls_out_of_band():
    env = TextWithToolsEnv()
    driver = EpisodeDriver(env, max_turns=3)
    driver.reset(seed=1)
    r = driver.act(CALL)
    assert r.observation.tool_results == [ToolResult(name="double", arguments={"x": 21}, output="42")]
    assert env.state.step_count == 0 and driver.reply.role == "tool"  # not a step of the environment
    r = driver.act('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert r.observation.tool_results[0].error and "unknown tool" in driver.reply.content
    r = driver.act("done")  # third and last turn
    assert r.terminated and driver.outcome.tool_calls == 2 and driver.outcome.turns == 3
    assert driver.outcome.success is False  # its score came from the environment, not the driver


def test_an_env_without_text_actions_ends_unscored_when_no_tool_is_called():
    driver = EpisodeDriver(ToolOnlyEnv())
    driver.reset(seed=1)
    assert driver.act(CALL).observation.text == "42"
    driver.act("no call here")
    assert driver.done and driver.outcome.success is False and driver.outcome.turns == 2


def test_the_turn_limit_defaults_to_the_environments_and_truncates():
    env = make_env("calculator_tools", max_turns=2)
    driver = EpisodeDriver(env)
    first = driver.reset(seed=1)
    assert first.observation.stop.max_turns == 2 and driver.turn_limit == 2
    driver.act("<calculator>1+1</calculator>")
    driver.act("<calculator>2+2</calculator>")  # the last turn: still text, the env reads its tag
    assert driver.done and driver.outcome.truncated and driver.outcome.tool_calls == 2


def test_explicit_steps_and_agent_tool_calls():
    driver = EpisodeDriver(TextWithToolsEnv())
    driver.reset(seed=1)
    assert driver.tool("double", {"x": 4}).observation.text == "8"
    assert driver.outcome.turns == 0 and driver.outcome.tool_calls == 1  # an agent's call is not a turn
    r = driver.step({"text": "fine"})
    assert r.terminated and driver.outcome.turns == 1


def test_bad_limits_are_refused_with_the_field_named():
    from vriksha.envs import EnvError

    with pytest.raises(EnvError, match="max_turns must be a positive integer"):
        EpisodeDriver(ToolStepEnv(), max_turns=0)
