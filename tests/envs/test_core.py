"""The core contract: reset/step/state, typed actions, validation errors, tools, async, registry."""

import asyncio
import json

import pytest

from vriksha.envs import (
    EpisodeStateError,
    InvalidActionError,
    StepResult,
    TextAction,
    ToolError,
    UnknownEnvironmentError,
    list_envs,
    make_env,
)
from vriksha.envs.core import Environment


def test_reset_step_state_and_turn_limit(countdown_env):
    env = make_env("test_countdown")
    r = env.reset(seed=3)
    assert r.observation.text == "Write the letter x exactly 4 times."
    assert [t.name for t in r.observation.tools] == ["echo"]
    assert env.state.step_count == 0 and env.state.seed == 3 and env.state.split == "train"
    r1 = env.step({"text": "xx"})
    assert r1.reward == 0.0 and not r1.done and r1.success is False
    r2 = env.step(TextAction(text="xxx"))
    assert r2.truncated and not r2.terminated  # the turn limit, Gymnasium's meaning
    assert env.state.step_count == 2 and env.state.done
    with pytest.raises(EpisodeStateError, match="reset"):
        env.step({"text": "xxxx"})
    env.reset(seed=3)
    r = env.step({"text": "xxxx"})
    assert r.terminated and r.reward == 1.0 and r.components == {"exact": 1.0} and r.success is True
    assert r.info == {}  # no protocol keys in info


def test_same_seed_same_episode_and_new_episode_ids(countdown_env):
    a, b = make_env("test_countdown"), make_env("test_countdown")
    assert a.reset(seed=11) == b.reset(seed=11)
    assert a.state.episode_id != b.state.episode_id
    seeds = set()
    for _ in range(5):
        a.reset()
        seeds.add(a.state.seed)
    assert len(seeds) > 1  # no seed: a fresh one, recorded in the state


def test_invalid_actions_name_the_problem(countdown_env):
    env = make_env("test_countdown")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="text"):
        env.step({"txt": "x"})
    with pytest.raises(InvalidActionError, match="JSON object"):
        env.step("x")
    with pytest.raises(InvalidActionError, match="split"):
        env.reset(seed=0, options={"split": "validation"})
    with pytest.raises(InvalidActionError, match="seed"):
        env.reset(seed=-1)
    assert env.state.step_count == 0  # refused actions do not count


def test_step_before_reset_and_after_close(countdown_env):
    env = make_env("test_countdown")
    with pytest.raises(EpisodeStateError):
        env.step({"text": "x"})
    with pytest.raises(EpisodeStateError):
        _ = env.state
    env.close()
    with pytest.raises(EpisodeStateError, match="closed"):
        env.reset(seed=1)


def test_tools_and_argument_checks(countdown_env):
    env = make_env("test_countdown")
    env.reset(seed=0)
    assert env.call_tool("echo", {"word": "hi"}) == "HI"
    with pytest.raises(ToolError, match="unknown tool"):
        env.call_tool("nope", {})
    with pytest.raises(ToolError, match="missing"):
        env.call_tool("echo", {})
    with pytest.raises(ToolError, match="unknown argument"):
        env.call_tool("echo", {"word": "a", "extra": 1})
    with pytest.raises(ToolError, match="must be string"):
        env.call_tool("echo", {"word": 3})


def test_schemas_and_json_round_trip(countdown_env):
    meta = countdown_env.metadata()
    assert meta["name"] == "test_countdown" and meta["max_turns"] == 2
    assert meta["schemas"]["action"]["required"] == ["text"]
    assert meta["schemas"]["action"]["additionalProperties"] is False
    json.dumps(meta)
    env = make_env("test_countdown")
    r = env.reset(seed=2)
    assert StepResult.model_validate_json(r.model_dump_json()) == r


def test_async_variants(countdown_env):
    env = make_env("test_countdown")

    async def go():
        r = await env.areset(seed=5)
        s = await env.astep({"text": "x" * 6})
        return r, s

    r, s = asyncio.run(go())
    assert "6 times" in r.observation.text and s.reward == 1.0


def test_registry(countdown_env):
    assert {"arithmetic", "python_functions", "calculator_tools", "test_countdown"} <= set(list_envs())
    with pytest.raises(UnknownEnvironmentError, match="no environment named 'nope'"):
        make_env("nope")
    env = make_env("tests.envs.conftest:CountdownEnv")
    assert env.name == "test_countdown"
    with pytest.raises(UnknownEnvironmentError):
        make_env("json:dumps")


def test_subclass_without_hooks_says_what_to_do():
    class Bare(Environment):
        name = "bare"

    with pytest.raises(NotImplementedError, match="_reset"):
        Bare().reset(seed=0)


def test_envs_import_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, vriksha.envs as e; e.make_env('arithmetic').reset(seed=1); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # environment processes and sandboxes stay light
