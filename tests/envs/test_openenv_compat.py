"""The real `openenv-core` clients drive vriksha environments through OpenEnv's wire format."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from openenv.core.client_types import StepResult as OEStepResult
from openenv.core.env_client import EnvClient as OEEnvClient
from openenv.core.env_server.types import Action as OEAction
from openenv.core.env_server.types import State as OEState
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from pydantic import BaseModel

from vriksha.envs.core import Environment, Observation, StepResult, Tool
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app

pytestmark = pytest.mark.timeout(120)


class ShoutEnv(Environment):
    """Upper-cases the text; two turns per episode; a `double` tool."""

    name = "shout"
    max_turns = 2

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        return Observation(text=f"say something (seed {seed}, level {options.get('level', 0)})")

    def _step(self, action: Any) -> StepResult:
        return StepResult(
            observation=Observation(text=action.text.upper()),
            reward=0.5,
            components={"loud": 0.5},
            success=True,
        )

    def tools(self) -> list[Tool]:
        schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
        return [Tool("double", "Double a number.", schema, lambda x: 2 * x)]


@pytest.fixture(scope="module")
def url():
    with ServerThread(create_app(ShoutEnv, EnvServerConfig(max_sessions=8))) as base:
        yield base


def test_generic_client_async(url):
    async def run() -> tuple[Any, Any, Any, Any]:
        async with GenericEnvClient(base_url=url) as env:
            first = await env.reset(seed=3, level=2)
            one = await env.step({"text": "hi"})
            two = await env.step({"text": "there"})
            state = await env.state()
            return first, one, two, state

    first, one, two, state = asyncio.run(run())
    assert first.observation["text"] == "say something (seed 3, level 2)" and first.done is False
    assert one.observation["text"] == "HI" and one.reward == 0.5 and one.done is False
    assert two.done is True  # max_turns=2: truncated maps to OpenEnv's done
    assert state["step_count"] == 2 and state["seed"] == 3


def test_generic_client_sync_wrapper_and_errors(url):
    with GenericEnvClient(base_url=url).sync() as env:
        assert env.reset(seed=1).observation["text"].startswith("say something")
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"wrong": 1})
        # the session survives a bad action
        assert env.step({"text": "ok"}).observation["text"] == "OK"


class ShoutAction(OEAction):
    text: str


class ShoutObs(BaseModel):
    text: str


class ShoutClient(OEEnvClient[ShoutAction, ShoutObs, OEState]):
    """A typed client written the way OpenEnv users write theirs."""

    def _step_payload(self, action: ShoutAction) -> dict[str, Any]:
        return action.model_dump()  # includes OpenEnv's `metadata` field

    def _parse_result(self, payload: dict[str, Any]) -> OEStepResult[ShoutObs]:
        return OEStepResult(
            observation=ShoutObs(text=payload["observation"]["text"]),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )

    def _parse_state(self, payload: dict[str, Any]) -> OEState:
        return OEState(**payload)


def test_typed_openenv_client(url):
    with ShoutClient(base_url=url).sync() as env:
        env.reset(seed=9)
        out = env.step(ShoutAction(text="typed"))
        assert isinstance(out.observation, ShoutObs) and out.observation.text == "TYPED"
        state = env.state()
        assert state.step_count == 1 and state.episode_id


def test_mcp_tool_client_over_ws(url):
    async def run() -> tuple[Any, Any]:
        async with MCPToolClient(base_url=url) as env:
            await env.reset(seed=0)
            tools = await env.list_tools()
            result = await env.call_tool("double", x=21)
            return tools, result

    tools, result = asyncio.run(run())
    assert [t.name for t in tools] == ["double"]
    assert str(result) == "42"


def test_openenv_http_endpoints(url):
    with httpx.Client(base_url=url) as http:
        assert http.get("/health").json()["status"] == "healthy"
        meta = http.get("/metadata").json()
        assert meta["name"] == "shout" and meta["description"]
        schema = http.get("/schema").json()
        assert {"action", "observation", "state"} <= set(schema)
        reset = http.post("/reset", json={"seed": 4}).json()
        assert reset["observation"]["text"].startswith("say something (seed 4") and reset["done"] is False
        step = http.post("/step", json={"action": {"text": "http"}}).json()
        assert step["observation"]["text"] == "HTTP" and step["reward"] == 0.5
        assert http.post("/step", json={"action": {"bad": 1}}).status_code == 422


def test_openenv_capacity_error():
    with ServerThread(create_app(ShoutEnv, EnvServerConfig(max_sessions=1))) as base:

        async def run() -> None:
            async with GenericEnvClient(base_url=base) as first:
                await first.reset()
                second = GenericEnvClient(base_url=base)
                try:
                    with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                        await second.reset()
                finally:
                    await second.close()

        asyncio.run(run())


def test_openenv_client_drives_builtin_arithmetic():
    from vriksha.envs.builtin import ArithmeticEnv

    with ServerThread(create_app(ArithmeticEnv, EnvServerConfig(max_sessions=2))) as base:
        with GenericEnvClient(base_url=base).sync() as env:
            a = env.reset(seed=123).observation["text"]
            assert a and env.reset(seed=123).observation["text"] == a  # same seed, same episode
            out = env.step({"text": "I think it is 7"})
            assert out.done is True and 0.0 <= out.reward <= 1.0
