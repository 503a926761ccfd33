"""SFT examples: JSONL lines as token ids with a mask on the assistant's tokens.

Two kinds of line, told apart by their keys:

    chat        {"messages": [{"role": ..., "content": ...}, ...], "tools": [...]?}
    trajectory  {"prompt_ids": [...], "completion_ids": [...], "loss_mask": [...], "success": ..., ...}
                (what `vriksha env eval --save` writes: the episode's exact token ids, 1 on generated tokens)

A chat is rendered with the tokenizer's chat template. The assistant mask comes from the template itself,
turn by turn: for assistant message k, the conversation before it rendered with the generation prompt and
the conversation through it rendered without; the tokens between the two are the turn's (its content and
end-of-turn token; what a template adds after the end-of-turn token is left out). Each rendering's tokens
must be a prefix of the whole conversation's, else the template rewrites earlier turns (some drop past
reasoning) and the example is refused with its line number. Transformers' `return_assistant_tokens_mask`
needs `{% generation %}` markers, which most templates (SmolLM2's among them) lack.

Tools: passed to the template; a template that ignores them (its rendering does not change) gets them in
the system message, as the rollouts' `describe_tools` presents them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from vriksha.envs.core import ToolSpec
from vriksha.envs.tool_calls import describe_tools
from vriksha.errors import ConfigError

__all__ = ["SFTExample", "assistant_mask", "load_examples", "read_examples"]


@dataclass(frozen=True, slots=True)
class SFTExample:
    ids: list[int]
    mask: list[int]  # 1 on tokens the loss is taken on

    @property
    def num_target(self) -> int:
        return sum(self.mask[1:])  # the first token has no context to be predicted from


def _render(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, generation: bool) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(messages), tools=tools, tokenize=False, add_generation_prompt=generation
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _with_tools_in_system(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any]
) -> list[dict[str, Any]]:
    probe = [{"role": "user", "content": "x"}]
    with_tools = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
    if with_tools != tokenizer.apply_chat_template(probe, tokenize=False):
        return messages  # the template renders the tools itself
    specs = [ToolSpec.model_validate(t.get("function", t) if isinstance(t, dict) else t) for t in tools]
    text = describe_tools(specs)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def assistant_mask(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None = None
) -> SFTExample:
    """The conversation's token ids and a mask that is 1 on the assistant turns' tokens (see the module's
    docstring); ValueError when the template does not render the conversation as growing prefixes."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template to render messages with")
    if tools:
        messages = _with_tools_in_system(tokenizer, messages, tools)
        tools = None
    ids = _render(tokenizer, messages, tools, generation=False)
    mask = [0] * len(ids)
    eos = tokenizer.eos_token_id
    turns = 0
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:k], tools, generation=True) if k else []
        through = _render(tokenizer, messages[: k + 1], tools, generation=False)
        for part, what in ((before, "before"), (through, "through")):
            if ids[: len(part)] != part:
                raise ValueError(
                    f"assistant turn {turns}: the chat template renders the conversation {what} it differently "
                    "from the whole conversation (it rewrites earlier turns), so its tokens cannot be told apart"
                )
        end = len(through)
        turn = through[len(before) :]
        if eos is not None and eos in turn:  # up to and including the end-of-turn token
            end = len(before) + len(turn) - turn[::-1].index(eos)
        for i in range(len(before), end):
            mask[i] = 1
        turns += 1
    if not turns:
        raise ValueError("no assistant message: nothing to train on")
    return SFTExample(ids, mask)


def _example(tokenizer: Any, row: Any, only_successful: bool) -> SFTExample | None:
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages: expected a list of {role, content} objects")
        tools = row.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError("tools: expected a list")
        return assistant_mask(tokenizer, messages, tools)
    if "completion_ids" in row:
        if only_successful and not row.get("success", False):
            return None
        prompt, completion, loss = row.get("prompt_ids"), row["completion_ids"], row.get("loss_mask")
        if not isinstance(prompt, list) or not isinstance(completion, list) or not isinstance(loss, list):
            raise ValueError("a trajectory needs the lists prompt_ids, completion_ids and loss_mask")
        if len(loss) != len(completion):
            raise ValueError(f"loss_mask has {len(loss)} entries for {len(completion)} completion_ids")
        ids = [int(t) for t in prompt + completion]
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(
                f"a token id outside the tokenizer's vocabulary of {vocab}: saved by another model?"
            )
        return SFTExample(ids, [0] * len(prompt) + [1 if m else 0 for m in loss])
    raise ValueError("expected `messages` (a chat) or `completion_ids` (a saved trajectory)")


def read_examples(tokenizer: Any, path: str | Path, only_successful: bool = True) -> list[SFTExample]:
    """The examples of one JSONL file; a ConfigError naming the file and line for one that cannot be used."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sft.data: {str(path)!r} not found")
    out = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                example = _example(tokenizer, json.loads(line), only_successful)
            except (ValueError, TypeError, KeyError, TemplateError) as exc:  # JSON, pydantic: ValueErrors
                raise ConfigError(f"sft.data: {path}:{n}: {exc}") from None
            if example is not None and example.num_target:
                out.append(example)
    return out


def load_examples(
    tokenizer: Any, paths: Sequence[str], only_successful: bool, max_length: int
) -> tuple[list[SFTExample], int]:
    """Every file's examples, each cut to `max_length` tokens; and how many were cut."""
    examples = [e for p in paths for e in read_examples(tokenizer, p, only_successful)]
    cut = sum(len(e.ids) > max_length for e in examples)
    examples = [SFTExample(e.ids[:max_length], e.mask[:max_length]) for e in examples]
    examples = [e for e in examples if e.num_target]
    if not examples:
        raise ConfigError(
            f"sft.data: no example with a token to train on in {', '.join(paths)} (trajectories: none "
            "successful? set sft.only_successful=false to keep every one)"
        )
    return examples, cut
