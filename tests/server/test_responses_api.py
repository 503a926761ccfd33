"""/v1/responses through the real `openai` SDK (`client.responses`) against `vriksha serve` on the embedded
model: plain, streamed, a tool round trip with a function_call_output, structured output,
previous_response_id, GET by id, and the errors."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(["--kv-cache-memory-gb", "0.1", "--responses-max-stored", "4"])


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=240) as c:
        yield c


def test_plain_response_equals_the_chat_completion_of_the_same_messages(client):
    r = client.responses.create(
        model=MODEL, instructions="Answer in one sentence.", input="What is the capital of France?",
        temperature=0, max_output_tokens=24,
    )  # fmt: skip
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        temperature=0,
        max_tokens=24,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == chat.choices[0].message.content and "Paris" in r.output_text
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert client.responses.retrieve(r.id).output_text == r.output_text


def test_streamed_events_add_up_to_the_whole_response(client):
    kw = dict(model=MODEL, input="Name three colors.", temperature=0, max_output_tokens=20)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.incomplete" if whole.status == "incomplete" else "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == whole.output_text


def test_tool_call_round_trip_with_a_function_call_output(client):
    first = client.responses.create(
        model=MODEL, input="What is 2 plus 3? Use the add tool.", tools=[ADD], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=64,
    )  # fmt: skip
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "add" and calls[0].call_id.startswith("call_")
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, ADD["parameters"])
    # the follow-up: the whole conversation sent back as items, the call's output among them
    items = [
        {"role": "user", "content": "What is 2 plus 3? Use the add tool."},
        {
            "type": "function_call",
            "call_id": calls[0].call_id,
            "name": "add",
            "arguments": calls[0].arguments,
        },
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": str(args["a"] + args["b"])},
    ]
    second = client.responses.create(
        model=MODEL, input=items, tools=[ADD], temperature=0, max_output_tokens=24
    )
    assert second.output and second.usage.input_tokens > first.usage.input_tokens
    # the same through previous_response_id: the same prompt, so the same greedy answer
    chained = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=items[2:], tools=[ADD], temperature=0,
        max_output_tokens=24,
    )  # fmt: skip
    assert chained.usage.input_tokens == second.usage.input_tokens
    assert [o.model_dump(exclude={"id"}) for o in chained.output] == [
        o.model_dump(exclude={"id"}) for o in second.output
    ]


def test_streamed_tool_call_arguments(client):
    events = list(
        client.responses.create(
            model=MODEL, input="Add 4 and 5.", tools=[ADD], tool_choice={"type": "function", "name": "add"},
            temperature=0, max_output_tokens=64, stream=True,
        )
    )  # fmt: skip
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done[0].arguments
    jsonschema.validate(json.loads(done[0].arguments), ADD["parameters"])
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "add"


def test_structured_output_matches_the_schema(client):
    r = client.responses.create(
        model=MODEL, input="Invent a person.", temperature=0, max_output_tokens=64,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(r.output_text), PERSON)


def test_previous_response_id_continues_the_conversation_from_the_cache(client):
    first = client.responses.create(
        model=MODEL, input="My name is Ada. Say hello.", temperature=0, max_output_tokens=12
    )
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input="What is my name?",
        temperature=0,
        max_output_tokens=12,
    )
    assert second.previous_response_id == first.id
    # the prompt holds the first turn, its prefix found in the prefix cache
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    explicit = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "My name is Ada. Say hello."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        temperature=0,
        max_output_tokens=12,
    )
    assert explicit.output_text == second.output_text
    assert explicit.usage.input_tokens == second.usage.input_tokens


def test_unknown_or_dropped_ids_are_404_and_unstored_responses_are_not_kept(client):
    with pytest.raises(openai.NotFoundError, match="previous_response_id|no response"):
        client.responses.create(
            model=MODEL, previous_response_id="resp_nope", input="hi", max_output_tokens=2
        )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    r = client.responses.create(model=MODEL, input="hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    # --responses-max-stored 4: a fifth drops the oldest
    ids = [client.responses.create(model=MODEL, input="hi", max_output_tokens=1).id for _ in range(5)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[-1]).id == ids[-1]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        ({"background": True}, "background"),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, extra, param):
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/responses", body=body, cast_to=dict)
    assert e.value.body["param"] == param


def test_a_stored_conversation_is_an_engine_session_and_an_unstored_one_is_not(client, server):
    def open_sessions() -> float:
        return server.metrics()["vriksha_sessions_open"]

    before = open_sessions()
    client.responses.create(model=MODEL, input="Say yes.", temperature=0, max_output_tokens=3, store=False)
    assert open_sessions() == before
    first = client.responses.create(model=MODEL, input="Say yes.", temperature=0, max_output_tokens=3)
    assert open_sessions() == before + 1
    client.responses.create(
        model=MODEL, previous_response_id=first.id, input="Again.", temperature=0, max_output_tokens=3
    )
    assert open_sessions() == before + 1  # the follow-up continues the same session
