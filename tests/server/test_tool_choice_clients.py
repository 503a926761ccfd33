"""A forced tool call through the clients that found it repeated, against `vriksha serve` on the embedded
SmolLM2 (greedy, whose likeliest way on after a call was the same call again): LangChain's `bind_tools`
with a named and a required choice, openai-agents running the tool, and the openai SDK's streamed named call."""

from __future__ import annotations

import asyncio

import openai
import pytest

pytestmark = pytest.mark.slow

QUESTION = "What is the weather in Paris?"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(["--kv-cache-memory-gb", "0.1"])


@pytest.fixture(scope="module")
def model(server) -> str:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as client:
        return client.models.list().data[0].id


def _chat_openai(server, model):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=model,
        base_url=f"{server.base_url}/v1",
        api_key="x",
        temperature=0,
        max_tokens=200,
        max_retries=0,
        timeout=300,
    )


def _get_weather_tool(seen: list[str]):
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the weather of a city."""
        seen.append(city)
        return f"sunny in {city}"

    return get_weather


def test_langchain_named_tool_choice_gets_one_call(server, model):
    llm = _chat_openai(server, model).bind_tools([_get_weather_tool([])], tool_choice="get_weather")
    msg = llm.invoke(QUESTION)
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"], msg.tool_calls
    assert msg.response_metadata["finish_reason"] == "tool_calls"

    streamed = None
    for chunk in llm.stream(QUESTION):
        streamed = chunk if streamed is None else streamed + chunk
    assert [c["name"] for c in streamed.tool_calls] == ["get_weather"], streamed.tool_calls
    assert streamed.tool_calls[0]["args"] == msg.tool_calls[0]["args"]
    assert streamed.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_required_tool_choice_does_not_repeat_a_call(server, model):
    llm = _chat_openai(server, model).bind_tools([_get_weather_tool([])], tool_choice="any")
    msg = llm.invoke(QUESTION)
    calls = [(c["name"], sorted(c["args"].items())) for c in msg.tool_calls]
    assert calls and len(set(map(repr, calls))) == len(calls), calls
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    # two cities: two calls, both kept
    two = llm.invoke("What is the weather in Paris and in London?")
    assert len(two.tool_calls) >= 1 and len({repr(c["args"]) for c in two.tool_calls}) == len(two.tool_calls)


def test_openai_agents_runs_a_named_tool_once(server, model):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the weather of a city."""
        seen.append(city)
        return f"sunny in {city}"

    async def run() -> object:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        agent = Agent(
            name="weather",
            instructions="You answer questions about the weather.",
            model=OpenAIChatCompletionsModel(model=model, openai_client=client),
            tools=[get_weather],
            model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=100),
            tool_use_behavior="stop_on_first_tool",
        )
        try:
            return await Runner.run(agent, QUESTION)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert len(seen) == 1, seen
    assert result.final_output == f"sunny in {seen[0]}"


def test_openai_sdk_streamed_named_call_finishes_with_tool_calls(server, model):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=300) as client:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": QUESTION}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=0,
            max_tokens=200,
            stream=True,
        )
        indexes, finish = set(), None
        for chunk in stream:
            for c in chunk.choices:
                indexes |= {tc.index for tc in c.delta.tool_calls or []}
                finish = c.finish_reason or finish
    assert indexes == {0}
    assert finish == "tool_calls"
