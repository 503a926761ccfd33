"""An episode as token ids: the prompt, then each generated turn and each environment reply.

The first observation becomes the prompt (its `messages`, or its text as one user message, through
the tokenizer's chat template; raw text when there is no template or `chat_template` is off). After
that the ids only grow: the engine's own completion ids exactly as generated (loss mask 1), then the
environment's reply rendered through the chat template and tokenised on its own (loss mask 0).
Generated tokens are never decoded and re-encoded, so the next turn's prompt is what the model saw.

The tokenizer is any Transformers-shaped one (`__call__`, `apply_chat_template`, `eos_token`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vriksha.envs.core import StepResult
from vriksha.envs.episode import Reply
from vriksha.envs.tool_calls import describe_tools

__all__ = ["PromptFormat", "Transcript"]

_SENTINEL = "\u2063VRIKSHA_TURN_END\u2063"


@dataclass(frozen=True, slots=True)
class PromptFormat:
    """How observations become prompts (the same defaults as the trainer's `rollout` section)."""

    chat_template: bool = True  # wrap text observations in the tokenizer's chat template
    system_prompt: str | None = None  # system message prepended to chat prompts
    describe_tools: bool = False  # add the episode's tools and the <tool_call> format to the system message


@dataclass(slots=True)
class Transcript:
    """One episode's token ids, and the chat history its replies are rendered against."""

    tokenizer: Any
    format: PromptFormat = field(default_factory=PromptFormat)
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the engine's, 0.0 on environment tokens
    loss_mask: list[int] = field(default_factory=list)  # 1 on generated tokens, 0 on environment tokens
    messages: list[dict[str, Any]] | None = None  # chat history (None: raw text prompts)

    @property
    def uses_chat(self) -> bool:
        return bool(self.format.chat_template and getattr(self.tokenizer, "chat_template", None))

    @property
    def context_ids(self) -> list[int]:
        """The next turn's prompt: everything so far."""
        return self.prompt_ids + self.completion_ids

    # -- building --------------------------------------------------------------

    def start(self, first: StepResult) -> list[int]:
        """Render the first observation as the prompt; returns its ids."""
        obs = first.observation
        self.messages = self._initial_messages(first) if self.uses_chat else None
        if self.messages is not None:
            self.prompt_ids = self._encode(self._render(self.messages, add_generation_prompt=True))
        else:
            self.prompt_ids = list(self.tokenizer(obs.text)["input_ids"])
        return list(self.prompt_ids)

    def add_generated(self, ids: list[int], logprobs: list[float]) -> None:
        if len(logprobs) != len(ids):
            raise ValueError(f"the engine returned {len(logprobs)} logprobs for {len(ids)} tokens")
        self.completion_ids += list(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.loss_mask += [1] * len(ids)

    def add_reply(self, said: str, reply: Reply, ended_with_eos: bool) -> None:
        """Close the model's turn (`said`, which ended on EOS or not) and present the environment's reply."""
        fb = self._reply_ids(reply, ended_with_eos)
        if self.messages is not None:
            self.messages = [
                *self.messages,
                {"role": "assistant", "content": said},
                {"role": reply.role, "content": reply.content},
            ]
        self.completion_ids += fb
        self.logprobs += [0.0] * len(fb)
        self.loss_mask += [0] * len(fb)

    # -- rendering --------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _initial_messages(self, first: StepResult) -> list[dict[str, Any]]:
        obs = first.observation
        messages = (
            [dict(m) for m in obs.messages] if obs.messages else [{"role": "user", "content": obs.text}]
        )
        system = self.format.system_prompt
        if obs.tools and self.format.describe_tools:
            extra = describe_tools(obs.tools)
            system = f"{system}\n\n{extra}" if system else extra
        if system:
            if messages and messages[0].get("role") == "system":
                messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{system}"}
            else:
                messages.insert(0, {"role": "system", "content": system})
        return messages

    def _reply_ids(self, reply: Reply, ended_with_eos: bool) -> list[int]:
        """Tokens that close the model's turn and present the environment's reply."""
        if self.messages is None:
            return self._encode("\n" + reply.content + "\n")
        marked = self._render(
            [
                *self.messages,
                {"role": "assistant", "content": _SENTINEL},
                {"role": reply.role, "content": reply.content},
            ],
            add_generation_prompt=True,
        )
        suffix = marked[marked.index(_SENTINEL) + len(_SENTINEL) :]
        eos_text = self.tokenizer.eos_token or ""
        if ended_with_eos and eos_text and suffix.startswith(eos_text):
            suffix = suffix[len(eos_text) :]
        return self._encode(suffix)
