"""`vriksha serve --model qwen2.5-coder-0.5b-instruct` (opt-in: `make models`) through the openai SDK: a chat
answer in code, tool calls in the model's own Hermes blocks (auto, required, a named function) and structured
outputs (response_format json_schema)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.packaged_models import QWEN_CODER as MODEL
from tests.packaged_models import WEATHER_TOOL as WEATHER
from tests.packaged_models import require_packaged

WEATHER_QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(server_factory):
    require_packaged(MODEL)
    server = server_factory(["--model", MODEL, "--kv-cache-memory-gb", "0.5", "--max-model-len", "4096"])
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=600) as c:
        yield c


def _weather_calls(message) -> list[dict]:
    calls = message.tool_calls or []
    for call in calls:
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    return [json.loads(call.function.arguments) for call in calls]


def test_serves_the_model_by_its_name_and_writes_code(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a Python function that reverses a string."}],
        max_tokens=64,
        temperature=0,
    )
    assert "def " in r.choices[0].message.content, r.choices[0].message.content


def test_the_model_calls_a_tool_by_itself_and_on_demand(client):
    auto = client.chat.completions.create(
        model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER], max_tokens=64, temperature=0
    )
    assert auto.choices[0].finish_reason == "tool_calls", auto.choices[0].message
    assert [a["city"] for a in _weather_calls(auto.choices[0].message)] == ["Paris"]
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        forced = client.chat.completions.create(
            model=MODEL,
            messages=WEATHER_QUESTION,
            tools=[WEATHER],
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_tokens=64,
            temperature=0,
        )
        assert forced.choices[0].finish_reason == "tool_calls", forced.choices[0].message
        assert len(_weather_calls(forced.choices[0].message)) == 1


def test_structured_output_follows_the_schema(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "language": {"enum": ["python", "rust", "go"]},
            "years": {"type": "integer", "minimum": 0, "maximum": 60},
        },
        "required": ["name", "language", "years"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a fictional programmer as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "programmer", "schema": schema}},
        max_tokens=96,
        temperature=0,
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
