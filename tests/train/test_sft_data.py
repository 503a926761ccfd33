"""SFT examples: the assistant-only mask built from the chat template, and the two kinds of JSONL line."""

from __future__ import annotations

import json

import pytest

from tests.tiny_llama import embedded_tokenizer
from vriksha.errors import ConfigError
from vriksha.train.sft import step_indices
from vriksha.train.sft_data import assistant_mask, read_examples

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CHAT = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 17 + 25?"},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>',
    },
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "The answer is 42."},
    {"role": "user", "content": "And doubled?"},
    {"role": "assistant", "content": "84"},
]


@pytest.fixture(scope="module")
def tok():
    return embedded_tokenizer()


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_the_mask_covers_each_assistant_turn_and_its_end_token_alone(tok):
    ex = assistant_mask(tok, CHAT, TOOLS)
    spans = _spans(ex.mask)
    texts = [tok.decode(ex.ids[a:b]) for a, b in spans]
    assistant = [m["content"] for m in CHAT if m["role"] == "assistant"]
    assert texts == [f"{content}{tok.eos_token}" for content in assistant]
    # every other token is the template's, the system's, the user's or the tool's
    rest = tok.decode([t for t, m in zip(ex.ids, ex.mask, strict=True) if not m])
    for m in CHAT:
        if m["role"] != "assistant":
            assert m["content"] in rest
    # SmolLM2's template ignores `tools`: they are presented in the system message, as the rollouts do
    assert "add two integers" in rest and "<tool_call>" in rest
    # the ids are the whole conversation's rendering
    whole = tok.apply_chat_template(
        [{**CHAT[0], "content": rest.split("<|im_end|>")[0].split("system\n", 1)[1]}, *CHAT[1:]],
        tokenize=False,
    )
    assert tok.decode(ex.ids) == whole


def test_a_template_that_rewrites_earlier_turns_is_refused(tok):
    class Rewriting:
        """SmolLM2's tokenizer under a template that drops all but the last assistant turn's content."""

        chat_template = "x"
        eos_token_id = tok.eos_token_id

        def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            parts = [
                f"{m['role']}: {m['content'] if m['role'] != 'assistant' or i == last else ''}\n"
                for i, m in enumerate(messages)
            ]
            return "".join(parts) + ("assistant: " if add_generation_prompt else "")

        def __call__(self, text, add_special_tokens=False):
            return tok(text, add_special_tokens=add_special_tokens)

    with pytest.raises(ValueError, match="rewrites earlier turns"):
        assistant_mask(Rewriting(), CHAT)


def test_jsonl_lines_chat_and_trajectories(tok, tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [
        {"messages": CHAT, "tools": TOOLS},
        {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5, 6], "loss_mask": [1, 1, 0], "success": True},
        {"prompt_ids": [1, 2, 3], "completion_ids": [7], "loss_mask": [1], "success": False},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    chat, trajectory = read_examples(tok, path, only_successful=True)
    assert chat.ids == assistant_mask(tok, CHAT, TOOLS).ids
    assert (trajectory.ids, trajectory.mask) == ([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 0])
    assert len(read_examples(tok, path, only_successful=False)) == 3


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"data.jsonl:2: "),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "no assistant message"),
        (json.dumps({"text": "hi"}), "expected `messages`"),
        (
            json.dumps({"prompt_ids": [1], "completion_ids": [2, 3], "loss_mask": [1], "success": True}),
            "1 entries for 2",
        ),
        (
            json.dumps({"prompt_ids": [1], "completion_ids": [10**9], "loss_mask": [1], "success": True}),
            "vocabulary",
        ),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tok, tmp_path, line, message):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=message):
        read_examples(tok, path)


def test_the_order_is_a_function_of_the_step_and_visits_every_example_each_epoch():
    first_epoch = step_indices(1, 5, 10, seed=3, shuffle=True) + step_indices(2, 5, 10, seed=3, shuffle=True)
    assert sorted(first_epoch) == list(range(10))
    assert step_indices(3, 5, 10, 3, True) + step_indices(4, 5, 10, 3, True) != first_epoch  # a fresh order
    assert step_indices(2, 5, 10, 3, True) == first_epoch[5:]
    assert step_indices(2, 4, 10, 3, False) == [4, 5, 6, 7]
