"""`vriksha serve --reasoning-parser qwen3` on the embedded model, its reply forced into a reasoning block
and an answer by a client grammar (which applies from the first token): reasoning_content apart from the
content, whole and streamed alike; a tool call after the reasoning still parsed; reasoning items in
/v1/responses."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
THINK_THEN_ANSWER = 'start: "<think>" /[a-z ]{3,24}/ "</think>\\n" /[A-Z][a-z ]{2,20}/ "."'
ADD_ARGS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
THINK_THEN_CALL = (
    'start: "<think>" /[a-z ]{3,24}/ "</think>\\n<tool_call>\\n{\\"name\\": \\"add\\", \\"arguments\\": " args '
    '"}\\n</tool_call>"\nargs: %json ' + json.dumps(ADD_ARGS)
)
MESSAGES = [{"role": "user", "content": "Think, then answer: what color is the sky?"}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(["--kv-cache-memory-gb", "0.1", "--reasoning-parser", "qwen3"])


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=240) as c:
        yield c


def _forced(grammar: str) -> dict:
    return {"structured_outputs": {"grammar": grammar}}


def test_chat_splits_the_reasoning_whole_and_streamed_alike(client, server):
    kw = dict(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=48, extra_body=_forced(THINK_THEN_ANSWER)
    )
    prompt = httpx.post(
        f"{server.base_url}/tokenize", json={"model": MODEL, "messages": MESSAGES}, timeout=60
    ).json()["tokens"]
    raw = (  # the same tokens without the parser: the text it splits
        client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=48, extra_body=_forced(THINK_THEN_ANSWER)
        )
        .choices[0]
        .text
    )
    whole = client.chat.completions.create(**kw).choices[0].message
    assert raw.startswith("<think>") and "</think>\n" in raw
    reasoning, answer = raw[len("<think>") :].split("</think>\n")
    assert whole.reasoning_content == reasoning and whole.content == answer
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            parts["reasoning"].append(getattr(c.delta, "reasoning_content", None) or "")
            parts["content"].append(c.delta.content or "")
            assert "<think>" not in parts["content"][-1] and "</think>" not in parts["reasoning"][-1]
    assert "".join(parts["reasoning"]) == reasoning and "".join(parts["content"]) == answer


def test_a_tool_call_after_the_reasoning_is_parsed(client):
    tools = [{"type": "function", "function": {"name": "add", "parameters": ADD_ARGS}}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=tools,
        temperature=0,
        max_tokens=64,
        extra_body=_forced(THINK_THEN_CALL),
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.reasoning_content
    assert msg.tool_calls[0].function.name == "add"
    assert set(json.loads(msg.tool_calls[0].function.arguments)) == {"a", "b"}
    assert not msg.content


def test_responses_return_a_reasoning_item_whole_and_streamed(client):
    kw = dict(
        model=MODEL, input=MESSAGES[0]["content"], temperature=0, max_output_tokens=48,
        extra_body=_forced(THINK_THEN_ANSWER),
    )  # fmt: skip
    r = client.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    reasoning = r.output[0].content[0].text
    assert reasoning and "<think>" not in reasoning and "<think>" not in r.output_text
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(**kw, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert [i.type for i in events[-1].response.output] == ["reasoning", "message"]


def test_without_a_reasoning_block_everything_is_content(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8)
    assert r.choices[0].message.content and getattr(r.choices[0].message, "reasoning_content", None) is None
