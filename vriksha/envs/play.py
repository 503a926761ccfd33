"""Episodes on an engine: the loop that the trainer's rollouts and evaluation and `vriksha env eval` share.

A group is one environment episode (one seed) played `group_size` times. The first turn of a group
is a single engine request with `n = group_size`, so the engine computes the prompt once and shares
its prefix across the group. Later turns of every live episode go to the engine together, each
continuing from its own exact token ids (`Transcript`); each completion is one `EpisodeDriver.act`.

The engine is any `RolloutEngine` (`envs/rollout_engine.py`): the colocated `LLM`, the trainer's
client of `vriksha serve` processes. Each finished episode becomes one `Episode`, the record the
trainer collates, checkpoints and updates on as it is.

On an engine with sessions (a `SessionEngine`: the `LLM`, the trainer's server client), every episode is a session:
its K/V stays pinned in the prefix cache while the environment answers, and the session closes when the episode
ends (a group's first turn, one request for the whole group, is a session of the group; its episodes' sessions
are named `group/member`, of the group's family).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vriksha.envs.core import EpisodeStateError
from vriksha.envs.episode import ActionShape, EpisodeDriver, EpisodeEnv
from vriksha.envs.rollout_engine import RolloutEngine, SessionEngine
from vriksha.envs.transcript import PromptFormat, Transcript
from vriksha.toolcalls import DEFAULT_PARSER

if TYPE_CHECKING:
    from vriksha import CompletionOutput, RequestOutput, SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["Episode", "Sampling", "play_groups"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How every turn is sampled."""

    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    max_tokens: int = 256  # per turn (an environment may ask for fewer)
    logprobs: bool = True  # record the sampled tokens' log-probabilities


@dataclass(slots=True)
class Episode:
    """One played episode, from the engine to the policy update: what the model saw and produced,
    exactly as token ids, and how it scored."""

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
    finish_reason: str | None = None  # how the last turn ended
    text: str = ""  # the last turn's completion text
    done: bool = False
    truncated: bool = False  # ended by a turn limit, not by the environment
    completions: list[str] = field(default_factory=list)  # the model's text, one per turn

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)


@dataclass(slots=True)
class _Live:
    """An episode in play: its environment, its driver (the score) and its transcript (the tokens)."""

    group: int
    member: int
    seed: int
    env: EpisodeEnv
    driver: EpisodeDriver
    transcript: Transcript
    finish_reason: str | None = None
    text: str = ""
    record: Episode | None = None  # set when the episode ends

    def finish(self) -> Episode:
        t, o = self.transcript, self.driver.outcome
        self.record = Episode(
            self.group,
            self.member,
            self.seed,
            t.prompt_ids,
            t.completion_ids,
            t.logprobs,
            t.loss_mask,
            reward=o.reward,
            components=dict(o.components),
            success=o.success,
            turns=o.turns,
            tool_calls=o.tool_calls,
            finish_reason=self.finish_reason,
            text=self.text,
            done=o.done,
            truncated=o.truncated,
            completions=list(o.completions),
        )
        return self.record


def _turn_seed(sampling_seed: int | None, turn: int, member: int) -> int | None:
    """The first turn samples from the group's seed; later turns from one derived per turn and member."""
    if sampling_seed is None:
        return None
    return sampling_seed if turn == 1 else sampling_seed * 7919 + turn * 131 + member


def play_groups(
    llm: RolloutEngine,
    tokenizer: Any,
    make_env: Callable[[], EpisodeEnv],
    seeds: Sequence[int],
    *,
    options: dict[str, Any] | None = None,
    group_size: int = 1,
    sampling: Sampling | None = None,
    sampling_seeds: Sequence[int | None] | None = None,
    max_turns: int | None = None,
    prompt_format: PromptFormat | None = None,
    on_turn: Callable[[list[Episode]], None] | None = None,
    action_shape: ActionShape | None = None,
    tool_parser: str = DEFAULT_PARSER,
) -> list[list[Episode]]:
    """Play `group_size` episodes for each episode seed; returns one list per seed (a group).

    `make_env()` gives a local `Environment` or a client of a remote one (then pass `action_shape`,
    e.g. `ActionShape.from_schema(...)`); each is closed at the end. `on_turn(finished)` runs after
    every turn with the episodes that turn finished.
    """
    from vriksha.engine.core.sampling_params import SamplingParams

    sampling = sampling or Sampling()
    fmt = prompt_format or PromptFormat()
    eos_ids = frozenset(llm.eos_token_ids)
    groups: list[list[_Live]] = []
    for gi, seed in enumerate(seeds):
        lives: list[_Live] = []
        for member in range(group_size):
            env = make_env()
            driver = EpisodeDriver(
                env,
                max_turns=max_turns,
                max_tokens=sampling.max_tokens,
                shape=action_shape,
                tool_parser=tool_parser,
            )
            first = driver.reset(seed=int(seed), options=dict(options or {}))
            transcript = Transcript(tokenizer, fmt)
            transcript.start(first)
            lives.append(_Live(gi, member, int(seed), env, driver, transcript))
        groups.append(lives)
    group_seed = [None if sampling_seeds is None else sampling_seeds[i] for i in range(len(groups))]
    sessions = _Sessions(llm)

    def params(live: _Live, n: int, turn: int) -> SamplingParams:
        stop = live.driver.stop
        seed = group_seed[live.group]
        return SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
            seed=_turn_seed(None if seed is None else int(seed), turn, live.member),
            max_tokens=stop.max_tokens or sampling.max_tokens,
            stop=stop.strings or None,
            stop_token_ids=stop.token_ids,
            include_stop_str_in_output=True,  # the environment sees the stop string it asked for
            logprobs=0 if sampling.logprobs else None,
        )

    try:
        # first turn: one request per group, n = group_size, so the prompt is computed once
        outputs = sessions.generate(
            [{"prompt_token_ids": g[0].transcript.context_ids} for g in groups],
            [params(g[0], group_size, 1) for g in groups],
            [sessions.of(g[0], whole_group=True) for g in groups],
        )

        finished: list[Episode] = []
        for g, out in zip(groups, outputs, strict=True):
            for live, comp in zip(g, sorted(out.outputs, key=lambda c: c.index), strict=True):
                live.transcript.prompt_ids = list(out.prompt_token_ids)
                _advance(live, comp, eos_ids, finished)
        if on_turn is not None:
            on_turn(finished)
        # later turns: each episode continues from its own token ids
        turn = 1
        while active := [lv for g in groups for lv in g if not lv.driver.done]:
            turn += 1
            outputs = sessions.generate(
                [{"prompt_token_ids": lv.transcript.context_ids} for lv in active],
                [params(lv, 1, turn) for lv in active],
                [sessions.of(lv) for lv in active],
            )
            if turn == 2:  # every episode holds its own pin now: the groups' first-turn sessions end
                for g in groups:
                    sessions.close(sessions.of(g[0], whole_group=True))
            finished = []
            for lv, out in zip(active, outputs, strict=True):
                _advance(lv, out.outputs[0], eos_ids, finished)
                if lv.driver.done:
                    sessions.close(sessions.of(lv))
            if on_turn is not None:
                on_turn(finished)
    finally:
        sessions.close_all()
        for g in groups:
            for lv in g:
                close = getattr(lv.env, "close", None)
                if close is not None:
                    close()
    return [[_record(lv) for lv in g] for g in groups]


class _Sessions:
    """One engine session per episode when the engine has them (a `SessionEngine`); else plain requests."""

    def __init__(self, llm: RolloutEngine) -> None:
        self.llm = llm
        self.engine: SessionEngine | None = llm if isinstance(llm, SessionEngine) else None
        self.prefix = uuid.uuid4().hex[:12]
        self.open: set[str] = set()

    def of(self, live: _Live, whole_group: bool = False) -> str:
        return f"episode-{self.prefix}-{live.group}" + ("" if whole_group else f"/{live.member}")

    def generate(
        self, prompts: list[dict[str, list[int]]], params: list[SamplingParams], ids: list[str]
    ) -> list[RequestOutput]:
        if self.engine is None:
            return self.llm.generate(prompts, params, use_tqdm=False)
        self.open.update(ids)
        return self.engine.generate(prompts, params, use_tqdm=False, session_id=ids)

    def close(self, session: str) -> None:
        if self.engine is not None and session in self.open:
            self.open.discard(session)
            self.engine.close_session(session)

    def close_all(self) -> None:
        for session in list(self.open):
            self.close(session)


def _advance(live: _Live, comp: CompletionOutput, eos_ids: frozenset[int], finished: list[Episode]) -> None:
    """Record one generated turn and let the environment answer it; a finished episode becomes its record."""
    ids = list(comp.token_ids)
    lps = list(comp.token_logprobs)
    live.transcript.add_generated(ids, lps)
    live.finish_reason = comp.finish_reason
    live.text = comp.text
    live.driver.act(comp.text)
    if live.driver.done:
        finished.append(live.finish())
        return
    ended_with_eos = bool(ids) and ids[-1] in eos_ids
    reply = live.driver.reply
    if reply is None:
        raise EpisodeStateError("the episode goes on but the driver holds no reply to present")
    live.transcript.add_reply(comp.text, reply, ended_with_eos)


def _record(live: _Live) -> Episode:
    if live.record is None:
        raise EpisodeStateError(f"episode {live.group}/{live.member} was still being played")
    return live.record
