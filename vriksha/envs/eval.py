"""`vriksha env eval NAME --model M --episodes N`: run a model through episodes and score it.

Episodes run in lock step: every turn, the prompts of all live episodes go to the engine as one
batch (chat-shaped when the observation carries messages), each completion is stepped into its
episode, and finished episodes drop out. Reports the mean reward (train signal), the success
rate (eval signal) and the mean of every reward component.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from vriksha.envs.core import Environment, StepResult
from vriksha.envs.registry import get_env_class

logger = logging.getLogger(__name__)

__all__ = ["EpisodeRecord", "EvalResult", "evaluate"]


@dataclass(slots=True)
class EpisodeRecord:
    seed: int
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    components: dict[str, float] = field(default_factory=dict)
    completions: list[str] = field(default_factory=list)
    truncated: bool = False


@dataclass(slots=True)
class EvalResult:
    env: str
    model: str
    split: str
    episodes: int
    mean_reward: float
    success_rate: float
    components: dict[str, float]
    mean_turns: float
    duration_s: float
    generated_tokens: int
    records: list[EpisodeRecord] = field(default_factory=list)

    def to_dict(self, with_records: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_records:
            d.pop("records")
        return d


class _Live:
    __slots__ = ("env", "record", "obs")

    def __init__(self, env: Environment, record: EpisodeRecord, obs: StepResult):
        self.env, self.record, self.obs = env, record, obs


def evaluate(
    env_name: str | type[Environment],
    llm: Any,
    *,
    episodes: int = 16,
    split: str = "test",
    seed: int = 0,
    max_tokens: int = 256,
    temperature: float = 0.0,
    env_kwargs: dict[str, Any] | None = None,
    reset_options: dict[str, Any] | None = None,
    on_step: Callable[[], None] | None = None,
    progress: bool = True,
    model_name: str | None = None,
) -> EvalResult:
    """Evaluate `llm` (a `vriksha.LLM`) on `episodes` episodes seeded `seed, seed+1, ...`."""
    from vriksha.engine.sampling_params import SamplingParams

    cls = get_env_class(env_name) if isinstance(env_name, str) else env_name
    if "text" not in cls.action_type.model_fields:
        raise ValueError(f"{cls.name}: its actions have no `text` field, so a language model cannot drive it")
    started = time.monotonic()
    options = {"split": split, **(reset_options or {})}
    live: list[_Live] = []
    records: list[EpisodeRecord] = []
    for i in range(episodes):
        env = cls(**(env_kwargs or {}))
        rec = EpisodeRecord(seed=seed + i)
        live.append(_Live(env, rec, env.reset(seed=seed + i, options=options)))
        records.append(rec)
    bar = _progress(episodes, f"{cls.name}", enabled=progress)
    tokens = 0
    while live:
        chat_items = [x for x in live if x.obs.observation.messages]
        text_items = [x for x in live if not x.obs.observation.messages]
        outputs: dict[int, str] = {}
        for items, is_chat in ((chat_items, True), (text_items, False)):
            if not items:
                continue
            params = [
                SamplingParams(
                    temperature=temperature,
                    max_tokens=max_tokens,
                    stop=x.obs.observation.metadata.get("stop") or None,
                    seed=x.record.seed,
                )
                for x in items
            ]
            if is_chat:
                outs = llm.chat([x.obs.observation.messages for x in items], params)
            else:
                outs = llm.generate([x.obs.observation.text for x in items], params, use_tqdm=False)
            for x, out in zip(items, outs, strict=True):
                comp = out.outputs[0]
                text = comp.text
                if isinstance(getattr(comp, "stop_reason", None), str) and not text.endswith(
                    comp.stop_reason
                ):
                    text += comp.stop_reason  # the engine strips a matched stop string; the env asked for it
                outputs[id(x)] = text
                tokens += len(comp.token_ids)
        still: list[_Live] = []
        for x in live:
            text = outputs[id(x)]
            x.record.completions.append(text)
            result = x.env.step({"text": text})
            x.record.turns += 1
            x.record.reward += result.reward
            if result.done:
                x.record.success = bool(result.info.get("success", False))
                x.record.components = dict(result.info.get("reward_components", {}))
                x.record.truncated = result.truncated
                x.env.close()
                bar.update(1)
            else:
                x.obs = result
                still.append(x)
        live = still
        if on_step is not None:  # one profiler step per turn: generation plus the environment steps
            on_step()
    bar.close()
    n = max(1, len(records))
    keys = sorted({k for r in records for k in r.components})
    return EvalResult(
        env=cls.name,
        model=model_name or str(getattr(llm, "model_name", None) or type(llm).__name__),
        split=split,
        episodes=len(records),
        mean_reward=sum(r.reward for r in records) / n,
        success_rate=sum(r.success for r in records) / n,
        components={k: sum(r.components.get(k, 0.0) for r in records) / n for k in keys},
        mean_turns=sum(r.turns for r in records) / n,
        duration_s=time.monotonic() - started,
        generated_tokens=tokens,
        records=records,
    )


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"eval {desc}", unit="ep")
