"""Episodes through the engine, captured token for token.

A group is one environment episode (one seed) played `group_size` times. The first turn of a
group is a single engine request with `n = group_size`, so the engine computes the prompt once
and shares its prefix across the group. Later turns (multi-turn episodes: tool calls, or an
environment that answers and waits for another try) continue from the exact token ids so far:
the engine's own completion ids, then the environment's reply rendered through the chat template
and tokenised on its own (loss mask 0). Generated tokens are never decoded and re-encoded.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vriksha.envs import Environment, StepResult, make_env
from vriksha.train.config import EnvConfig, RolloutConfig

logger = logging.getLogger(__name__)

__all__ = ["Episode", "RolloutWorker", "parse_tool_call", "TOOL_CALL_FORMAT"]

TOOL_CALL_FORMAT = (
    'To call a tool, reply with only <tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>; '
    "the result comes back in the next message. Tools:\n{tools}"
)
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.DOTALL)
_SENTINEL = "\u2063VRIKSHA_TURN_END\u2063"


@dataclass(slots=True)
class Episode:
    """One trajectory: what the model saw and produced, exactly as token ids, and how it scored."""

    group: int
    member: int  # index within the group
    seed: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    engine_logprobs: list[float] = field(default_factory=list)  # 0.0 on environment tokens
    loss_mask: list[int] = field(default_factory=list)  # 1 on generated tokens, 0 on environment tokens
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    success: bool = False
    turns: int = 0
    tool_calls: int = 0
    finish_reason: str | None = None
    text: str = ""  # the last turn's completion text (for logs)
    done: bool = False

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` -> (name, arguments), else None."""
    m = _TOOL_CALL.search(text)
    if not m:
        return None
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return obj["name"], args if isinstance(args, dict) else {}


@dataclass(slots=True)
class _Live:
    episode: Episode
    env: Environment
    messages: list[dict[str, Any]] | None  # chat history (None: raw text prompts)
    context_ids: list[int]  # prompt + everything so far: the next turn's prompt


class RolloutWorker:
    """Plays episodes of one environment on an engine (`LLM`-shaped: `generate`, `tokenizer`)."""

    def __init__(self, llm: Any, tokenizer: Any, env_cfg: EnvConfig, cfg: RolloutConfig) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.env_cfg = env_cfg
        self.cfg = cfg
        self.use_chat = bool(cfg.chat_template and getattr(tokenizer, "chat_template", None))
        self.eos_ids = self._eos_ids()

    def _eos_ids(self) -> set[int]:
        ids = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(eos)
        return ids

    # -- rendering ---------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _initial_messages(self, first: StepResult) -> list[dict[str, Any]] | None:
        obs = first.observation
        if not self.use_chat:
            return None
        messages = (
            [dict(m) for m in obs.messages] if obs.messages else [{"role": "user", "content": obs.text}]
        )
        system = self.cfg.system_prompt
        if obs.tools and self.cfg.describe_tools:
            tools = "\n".join(
                f"- {t.name}: {t.description} parameters: {json.dumps(t.parameters)}" for t in obs.tools
            )
            extra = TOOL_CALL_FORMAT.format(tools=tools)
            system = f"{system}\n\n{extra}" if system else extra
        if system:
            if messages and messages[0].get("role") == "system":
                messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{system}"}
            else:
                messages.insert(0, {"role": "system", "content": system})
        return messages

    def _prompt_ids(self, first: StepResult, messages: list[dict[str, Any]] | None) -> list[int]:
        if messages is not None:
            return self._encode(self._render(messages, add_generation_prompt=True))
        ids = list(self.tokenizer(first.observation.text)["input_ids"])
        return ids

    def _feedback_ids(self, live: _Live, reply_text: str, role: str, ended_with_eos: bool) -> list[int]:
        """Tokens that close the model's turn and present the environment's reply."""
        if live.messages is None:
            return self._encode("\n" + reply_text + "\n")
        marked = self._render(
            [
                *live.messages,
                {"role": "assistant", "content": _SENTINEL},
                {"role": role, "content": reply_text},
            ],
            add_generation_prompt=True,
        )
        suffix = marked[marked.index(_SENTINEL) + len(_SENTINEL) :]
        eos_text = self.tokenizer.eos_token or ""
        if ended_with_eos and eos_text and suffix.startswith(eos_text):
            suffix = suffix[len(eos_text) :]
        return self._encode(suffix)

    # -- playing -----------------------------------------------------------

    def _sampling(self, n: int, seed: int | None, greedy: bool, max_tokens: int) -> Any:
        from vriksha.engine.sampling_params import SamplingParams

        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else self.cfg.temperature,
            top_p=1.0 if greedy else self.cfg.top_p,
            seed=seed,
            max_tokens=max_tokens,
            logprobs=0,
        )

    def _new_env(self) -> Environment:
        return make_env(self.env_cfg.name, **self.env_cfg.kwargs)

    def play(
        self,
        seeds: Sequence[int],
        split: str,
        group_size: int,
        sampling_seeds: Sequence[int] | None = None,
        greedy: bool = False,
        max_new_tokens: int | None = None,
    ) -> list[list[Episode]]:
        """Play `group_size` episodes for each episode seed; returns one list per seed (a group)."""
        max_tokens = max_new_tokens or self.cfg.max_new_tokens
        options = {**self.env_cfg.options, "split": split}
        groups: list[list[_Live]] = []
        for gi, seed in enumerate(seeds):
            lives = []
            prompt_ids: list[int] | None = None
            for _ in range(group_size):
                env = self._new_env()
                first = env.reset(seed=int(seed), options=options)
                messages = self._initial_messages(first)
                if prompt_ids is None:
                    prompt_ids = self._prompt_ids(first, messages)
                ep = Episode(group=gi, member=len(lives), seed=int(seed), prompt_ids=list(prompt_ids))
                lives.append(_Live(ep, env, messages, list(prompt_ids)))
            groups.append(lives)

        # first turn: one request per group, n = group_size, so the prompt is computed once
        requests = [{"prompt_token_ids": g[0].context_ids} for g in groups]
        params = [
            self._sampling(
                group_size, None if sampling_seeds is None else int(sampling_seeds[i]), greedy, max_tokens
            )
            for i in range(len(groups))
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        for g, out in zip(groups, outputs, strict=True):
            prompt_ids = list(out.prompt_token_ids)
            for live, comp in zip(g, sorted(out.outputs, key=lambda c: c.index), strict=True):
                live.episode.prompt_ids = prompt_ids
                live.context_ids = list(prompt_ids)
                self._advance(live, comp)

        # later turns: each trajectory continues from its own token ids
        turn = 1
        while True:
            active = [lv for g in groups for lv in g if not lv.episode.done]
            if not active:
                break
            turn += 1
            params = [
                self._sampling(
                    1,
                    None
                    if sampling_seeds is None
                    else int(sampling_seeds[lv.episode.group]) * 7919 + turn * 131 + lv.episode.member,
                    greedy,
                    max_tokens,
                )
                for lv in active
            ]
            outputs = self.llm.generate(
                [{"prompt_token_ids": lv.context_ids} for lv in active], params, use_tqdm=False
            )
            for lv, out in zip(active, outputs, strict=True):
                self._advance(lv, out.outputs[0])

        for g in groups:
            for lv in g:
                lv.env.close()
        return [[lv.episode for lv in g] for g in groups]

    def _advance(self, live: _Live, comp: Any) -> None:
        """Record one generated turn and let the environment answer it.

        An environment whose action type takes `text` parses tool calls itself (it sees every turn
        through `step`); for one whose action type is a bare tool call, or one that offers tools
        only through `call_tool`, the `<tool_call>{...}</tool_call>` block is parsed here.
        """
        ep = live.episode
        ids = list(comp.token_ids)
        lps = list(comp.token_logprobs)
        if len(lps) != len(ids):
            raise RuntimeError(f"engine returned {len(lps)} logprobs for {len(ids)} tokens")
        ep.completion_ids += ids
        ep.engine_logprobs += [float(x) for x in lps]
        ep.loss_mask += [1] * len(ids)
        live.context_ids += ids
        ep.turns += 1
        ep.finish_reason = comp.finish_reason
        ep.text = comp.text
        ended_with_eos = bool(ids) and ids[-1] in self.eos_ids
        last_turn = ep.turns >= self.cfg.max_turns
        env = live.env
        fields = env.action_type.model_fields
        takes_text = "text" in fields
        call = parse_tool_call(comp.text) if not last_turn else None
        if takes_text and ("tool" in fields or not env.tools() or call is None):
            result = env.step({"text": comp.text})
            role = "user"
        elif call is not None and "tool" in fields:
            result = env.step({"tool": call[0], "arguments": call[1]})
            role = "tool"
        elif call is not None:
            ep.tool_calls += 1
            try:
                reply = env.call_tool(*call)
            except Exception as exc:  # a bad call is the model's mistake: it reads the error
                reply = f"error: {exc}"
            self._append_reply(live, comp.text, reply, "tool", ended_with_eos)
            return
        else:  # a tool-only environment and no call: the episode ends unscored
            ep.done = True
            return
        self._score(ep, result)
        info = result.info or {}
        if "tool_result" in info:
            ep.tool_calls += 1
        if result.done or last_turn:
            ep.done = True
            return
        self._append_reply(live, comp.text, result.observation.text, role, ended_with_eos)

    def _append_reply(self, live: _Live, text: str, reply: str, role: str, ended_with_eos: bool) -> None:
        ep = live.episode
        fb = self._feedback_ids(live, reply, role, ended_with_eos)
        if live.messages is not None:
            live.messages = [
                *live.messages,
                {"role": "assistant", "content": text},
                {"role": role, "content": reply},
            ]
        ep.completion_ids += fb
        ep.engine_logprobs += [0.0] * len(fb)
        ep.loss_mask += [0] * len(fb)
        live.context_ids += fb

    @staticmethod
    def _score(ep: Episode, result: StepResult) -> None:
        ep.reward += float(result.reward)
        info = result.info or {}
        if "reward_components" in info:
            ep.components = {k: float(v) for k, v in info["reward_components"].items()}
        if "success" in info:
            ep.success = bool(info["success"])
