"""The reasoning parsers: whole replies and streams cut at every character give the same split."""

from __future__ import annotations

import pytest

from vriksha.errors import ConfigError
from vriksha.reasoning import REASONING_PARSERS, get_reasoning_parser

REPLIES = [
    ("<think>\nweigh it\n</think>\n\nThe answer.", "\nweigh it\n", "The answer."),
    ("  <think>a < b, so </thin then</think>x", "a < b, so </thin then", "x"),
    ("No reasoning here.", None, "No reasoning here."),
    ("<thinking is not the tag", None, "<thinking is not the tag"),
    ("<think>cut off while thinking", "cut off while thinking", ""),
    ("<think></think>", "", ""),
    ("", None, ""),
    ("<th", None, "<th"),
    ("<think>x</think><tool_call>{}</tool_call>", "x", "<tool_call>{}</tool_call>"),
]


def _streamed(parser, text: str, cuts: list[int], prompt: str | None = None) -> tuple[str, str, bool]:
    s = parser.stream(prompt)
    reasoning, content = [], []
    bounds = [0, *cuts, len(text)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        piece = s.feed(text[a:b], final=i == len(bounds) - 2)
        reasoning.append(piece.reasoning)
        content.append(piece.content)
    return "".join(reasoning), "".join(content), s.saw_reasoning


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@pytest.mark.parametrize(("text", "reasoning", "content"), REPLIES)
def test_whole_reply(name, text, reasoning, content):
    assert get_reasoning_parser(name).split(text) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), REPLIES)
def test_every_split_point_and_every_character_alone_give_the_whole_split(text, reasoning, content):
    parser = get_reasoning_parser("qwen3")
    for cut in range(len(text) + 1):
        assert _streamed(parser, text, [cut]) == (reasoning or "", content, reasoning is not None), cut
    assert _streamed(parser, text, list(range(1, len(text)))) == (
        reasoning or "",
        content,
        reasoning is not None,
    )


def test_a_tag_split_across_pieces_is_held_back_not_sent_as_text():
    s = get_reasoning_parser("qwen3").stream()
    assert not s.feed("<thi")  # could still be the opening tag
    assert s.feed("nk>plan</th").reasoning == "plan"  # "</th" held back
    piece = s.feed("ink>done")
    assert (piece.reasoning, piece.content) == ("", "done")


def test_deepseek_r1_reply_starts_inside_the_block_the_prompt_opened():
    parser = get_reasoning_parser("deepseek_r1")
    prompt = "<｜User｜>2+2?<｜Assistant｜><think>\n"
    assert parser.split("four, plainly</think>\n4", prompt) == ("four, plainly", "4")
    assert parser.split("still thinking", prompt) == ("still thinking", "")
    assert parser.split("no tag at all") == (None, "no tag at all")  # the prompt did not open it
    # qwen3 does not read the prompt: its replies open their own block
    assert get_reasoning_parser("qwen3").split("a</think>b", prompt) == (None, "a</think>b")


def test_unknown_name_lists_the_choices():
    with pytest.raises(ConfigError, match="deepseek_r1, qwen3, smollm3"):
        get_reasoning_parser("nope")
