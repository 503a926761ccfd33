"""Tools over MCP: a real `mcp` ClientSession over streamable HTTP against the env server's `/mcp`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from vriksha.envs.client import EnvClient
from vriksha.envs.core import Environment, Observation, StepResult, Tool
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app

pytestmark = pytest.mark.timeout(120)


class NotebookEnv(Environment):
    """An episode holds a note; tools read it and do arithmetic."""

    name = "notebook"
    max_turns = 10

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        self.note = f"note-{seed}"
        return Observation(text="use the tools")

    def _step(self, action: Any) -> StepResult:
        return StepResult(
            observation=Observation(text=action.text), info={"reward_components": {}, "success": False}
        )

    def tools(self) -> list[Tool]:
        return [
            Tool(
                "add",
                "Add two integers.",
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
                lambda a, b: a + b,
            ),
            Tool(
                "read_note",
                "Read this episode's note.",
                {"type": "object", "properties": {}},
                lambda: self.note,
            ),
        ]


@pytest.fixture(scope="module")
def server_url():
    app = create_app(NotebookEnv, EnvServerConfig(max_sessions=8, heartbeat_s=1.0))
    with ServerThread(app) as url:
        yield url


async def _mcp(url: str, fn: Any, headers: dict[str, str] | None = None) -> Any:
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url + "/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                return init, await fn(session)


def test_initialize_list_and_call_tools(server_url):
    async def body(session: ClientSession) -> Any:
        tools = await session.list_tools()
        added = await session.call_tool("add", {"a": 20, "b": 22})
        note = await session.call_tool("read_note", {})
        return tools, added, note

    init, (tools, added, note) = asyncio.run(_mcp(server_url, body))
    assert init.server_info.name == "vriksha-notebook"
    by_name = {t.name: t for t in tools.tools}
    assert set(by_name) == {"add", "read_note"}
    assert by_name["add"].input_schema["required"] == ["a", "b"]
    assert not added.is_error and added.content[0].text == "42"
    assert note.content[0].text.startswith("note-")  # the MCP session got its own fresh episode


def test_bad_tool_calls_are_tool_errors_not_crashes(server_url):
    async def body(session: ClientSession) -> Any:
        unknown = await session.call_tool("nope", {})
        missing = await session.call_tool("add", {"a": 1})
        ok = await session.call_tool("add", {"a": 1, "b": 2})
        return unknown, missing, ok

    _, (unknown, missing, ok) = asyncio.run(_mcp(server_url, body))
    assert unknown.is_error and "unknown tool" in unknown.content[0].text
    assert missing.is_error and "missing required argument" in missing.content[0].text
    assert not ok.is_error and ok.content[0].text == "3"  # the session survives bad calls


def test_header_binds_mcp_to_a_websocket_session(server_url):
    with EnvClient(server_url) as env:
        env.reset(seed=1234)

        async def body(session: ClientSession) -> Any:
            return await session.call_tool("read_note", {})

        _, note = asyncio.run(_mcp(server_url, body, headers={"X-Vriksha-Session": env.session_id}))
        assert note.content[0].text == "note-1234"


def test_unknown_bound_session_is_reported(server_url):
    async def body(session: ClientSession) -> Any:
        return await session.call_tool("read_note", {})

    _, res = asyncio.run(_mcp(server_url, body, headers={"X-Vriksha-Session": "no-such-session"}))
    assert res.is_error and "no live session" in res.content[0].text


def test_builtin_calculator_tools_over_mcp():
    from vriksha.envs.builtin import CalculatorToolsEnv

    app = create_app(CalculatorToolsEnv, EnvServerConfig(max_sessions=4))
    with ServerThread(app) as url:

        async def body(session: ClientSession) -> Any:
            return await session.list_tools(), await session.call_tool(
                "calculator", {"expression": "(6 * 7) - 2"}
            )

        _, (tools, out) = asyncio.run(_mcp(url, body))
        assert "calculator" in {t.name for t in tools.tools}
        assert not out.is_error and float(out.content[0].text) == 40
