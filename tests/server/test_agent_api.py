"""What agents, evaluation harnesses and RL rollouts ask of the server, through the `openai` client against a
real `vriksha serve` on a tiny random Llama: tools (auto, required, named; streamed), structured outputs
(response_format, pydantic parse, 50 random JSON schemas), penalties and logit bias, prompt log-probs,
/tokenize and /detokenize, and 400s that name the bad field."""

from __future__ import annotations

import json
import random

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    return server_factory(
        ["--model", str(tiny_model_dir), "--kv-cache-memory-gb", "0.05", "--served-model-name", MODEL]
    )


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def _check_calls(calls, names):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_choice_required_always_returns_valid_calls(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        choice = r.choices[0]
        # the grammar admits one call or more (parallel calls are allowed): a random model may run on making
        # calls until max_tokens, and then the answer ends with "length", its complete calls still returned
        assert choice.finish_reason in ("tool_calls", "length"), choice
        _check_calls(choice.message.tool_calls, {"get_weather", "add"})


def test_named_function_and_no_parallel_calls(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        temperature=1.0,
        seed=7,
        n=2,
        max_tokens=120,
    )
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        _check_calls(choice.message.tool_calls, {"add"})


def test_auto_parses_a_call_the_model_writes(client):
    # the tiny model writes what the regex allows: a Hermes call block, which `auto` must parse
    written = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
    )
    regex = written.replace("{", "\\{").replace("}", "\\}")
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=60,
        temperature=0,
        extra_body={"structured_outputs": {"regex": regex}},
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"})
    ]
    none = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=60,
        temperature=0,
        extra_body={"structured_outputs": {"regex": regex}},
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content == written


def test_streamed_tool_calls_reassemble_to_the_whole_answer(client):
    kw = dict(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        temperature=1.0,
        seed=11,
        max_tokens=120,
    )
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    pieces = 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for tc in d.tool_calls or []:
            pieces += 1
            entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:
                entry["id"] = tc.id
            if tc.function and tc.function.name:
                entry["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert pieces > len(calls)  # arguments arrive in several deltas
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert all(c["id"] for c in calls.values())


def test_tool_results_go_through_the_chat_template(server):
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    r = httpx.post(server.base_url + "/tokenize", json={"messages": messages, "tools": TOOLS}, timeout=60)
    assert r.status_code == 200, r.text
    text = httpx.post(
        server.base_url + "/detokenize", json={"tokens": r.json()["tokens"]}, timeout=60
    ).json()["prompt"]
    assert '"name": "get_weather"' in text  # the tool list in the system message
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}' in text
    assert "<tool_response>\n18 degrees, sunny\n</tool_response>" in text
    assert r.json()["count"] == len(r.json()["tokens"])


class Person(BaseModel):
    name: str = Field(max_length=12)  # bounded: a random model would otherwise write a string to max_tokens
    age: int = Field(ge=0, le=150)


def test_parse_with_a_pydantic_model(client):
    parsed = []
    for seed in range(1, 6):  # a random model may run to max_tokens inside a string: then the next seed
        try:
            r = client.chat.completions.parse(
                model=MODEL,
                messages=[{"role": "user", "content": "A person"}],
                response_format=Person,
                temperature=0.7,
                seed=seed,
                max_tokens=200,
                extra_body={
                    "bad_words": ["\\"]
                },  # a random model may write long escapes; the test wants it short
            )
        except openai.LengthFinishReasonError:
            continue
        parsed.append(r.choices[0].message.parsed)
    assert parsed, "every seed ran to max_tokens"
    assert all(isinstance(p, Person) for p in parsed)


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "enum"] + (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(0, 6)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if kind == "number":
        lo = rng.uniform(-10, 10)
        return {"type": "number", "minimum": round(lo, 2), "maximum": round(lo + rng.uniform(0.5, 20), 2)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, None, True], rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": _random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    props = {f"k{i}": _random_schema(rng, depth + 1) for i in range(rng.randint(1, 3))}
    required = rng.sample(sorted(props), rng.randint(0, len(props)))
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def test_fifty_random_json_schemas_at_temperature_one(client):
    rng = random.Random(0)
    done = 0
    for i in range(50):
        schema = {
            "type": "object",
            "properties": {"v": _random_schema(rng)},
            "required": ["v"],
            "additionalProperties": False,
        }
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "JSON please"}],
            temperature=1.0,
            seed=i,
            max_tokens=150,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{i}", "schema": schema, "strict": True},
            },
            extra_body={"bad_words": ["\\"]},
        )
        c = r.choices[0]
        assert c.finish_reason == "stop", (schema, c.message.content)
        jsonschema.validate(json.loads(c.message.content), schema)
        done += 1
    assert done == 50


def test_schema_streams_with_n_two(client):
    schema = WEATHER["function"]["parameters"]
    texts: dict[int, str] = {}
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=1.0,
        seed=3,
        max_tokens=150,
        stream=True,
        n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    ):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(texts) == [0, 1]
    for text in texts.values():
        jsonschema.validate(json.loads(text), schema)


def test_vllm_structured_outputs_json_field(client):
    schema = WEATHER["function"]["parameters"]
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=1.0,
        seed=5,
        max_tokens=150,
        extra_body={"structured_outputs": {"json": schema}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


A, B = 1000, 2000


def test_logit_bias_over_the_openai_client(client, server):
    r = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=8,
        temperature=1.0,
        seed=0,
        logit_bias={"1234": 100},
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    token = httpx.post(server.base_url + "/detokenize", json={"tokens": [1234]}, timeout=30).json()["prompt"]
    assert r.choices[0].logprobs.tokens == [token] * 8
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        temperature=1.0,
        seed=0,
        logit_bias={"1234": 100},
        logprobs=True,
    )
    assert [t.token for t in r.choices[0].logprobs.content] == [token] * 4


def _native(server, **sampling) -> list[int]:
    body = {
        "text": "Hello there, how are you",
        "sampling_params": {
            "temperature": 0,
            "max_tokens": 12,
            "ignore_eos": True,
            "allowed_token_ids": [A, B],
            "logit_bias": {str(A): 21.5, str(B): 20.0},
            **sampling,
        },
    }
    r = httpx.post(server.base_url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["token_ids"]


def test_each_penalty_over_http_changes_the_output(server):
    assert _native(server) == [A] * 12
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 1.0}, {"repetition_penalty": 1.2}):
        ids = _native(server, **penalty)
        assert ids[0] == A and B in ids[:4], penalty  # A is penalised once it has been generated


def test_echo_logprobs_and_prompt_logprobs(client, server):
    r = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=2, temperature=0, echo=True, logprobs=1
    )
    lp = r.choices[0].logprobs
    n_prompt = r.usage.prompt_tokens
    assert r.choices[0].text.startswith("The quick brown fox")
    assert lp.token_logprobs[0] is None and all(isinstance(x, float) for x in lp.token_logprobs[1:])
    assert len(lp.tokens) == n_prompt + 2
    body = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 1, "prompt_logprobs": 0},
        timeout=60,
    ).json()
    plp = body["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == n_prompt
    assert [round(next(iter(e.values()))["logprob"], 4) for e in plp[1:]] == [
        round(x, 4) for x in lp.token_logprobs[1:n_prompt]
    ]


@pytest.mark.parametrize(
    "body,param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                }
            },
            "response_format",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": 5}}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"extra": 1}, None),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"functions": [{"name": "f"}]}, "functions"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 1}},
                            "required": ["a"],
                        },
                    },
                }
            },
            "response_format",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **body},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    if param is not None:
        assert err["param"] == param or param in err["message"], err
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
