"""Train on a vriksha environment with TRL's `GRPOTrainer`.

    from trl import GRPOConfig, GRPOTrainer
    from vriksha.envs.trl_adapter import build_dataset, make_reward_func, environment_factory

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[make_reward_func("arithmetic"), make_reward_func("arithmetic", component="format")],
        args=GRPOConfig(..., reward_weights=[1.0, 0.0]),      # weight 0: logged, not trained on
        train_dataset=build_dataset("arithmetic", 512),
        # multi-turn tool environments: the episode's tools become TRL tools
        # environment_factory=environment_factory("calculator_tools"),
    )

- `build_dataset` rows carry the prompt plus `env_seed`/`env_split`/`env_options`, so the reward
  function re-creates exactly the episode the prompt came from (ground truth stays in the env).
- `make_reward_func` has TRL's signature `reward_func(prompts, completions, **kwargs) -> list[float]`;
  with an `environment_factory` it scores the final answer in the very environment instance the
  rollout used (TRL passes them as `environments=`).
- `environment_factory(name)` returns a zero-argument callable creating `VrikshaTRLEnv`s: `reset(**row)`
  plus one method per environment tool, with the signature and Google-style docstring TRL reads.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

from vriksha.envs.core import Environment, StepResult, Tool
from vriksha.envs.episode import EpisodeDriver
from vriksha.envs.registry import get_env_class

logger = logging.getLogger(__name__)

__all__ = ["build_dataset", "build_rows", "make_reward_func", "environment_factory", "VrikshaTRLEnv"]


def build_rows(
    env_name: str,
    n: int,
    *,
    split: str = "train",
    seed: int = 0,
    options: dict[str, Any] | None = None,
    conversational: bool = True,
    env_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`n` episodes (seeds `seed..seed+n-1`) as rows: prompt, env_name, env_seed, env_split, env_options."""
    env = get_env_class(env_name)(**(env_kwargs or {}))
    rows = []
    for i in range(n):
        opts = {"split": split, **(options or {})}
        obs = env.reset(seed=seed + i, options=opts).observation
        if conversational:
            prompt: Any = obs.messages or [{"role": "user", "content": obs.text}]
        else:
            prompt = obs.text
        rows.append(
            {
                "prompt": prompt,
                "env_name": env.name,
                "env_seed": seed + i,
                "env_split": split,
                "env_options": json.dumps(options or {}),
            }
        )
    env.close()
    return rows


def build_dataset(env_name: str, n: int, **kwargs: Any):
    """A `datasets.Dataset` of `build_rows(...)`; what `GRPOTrainer(train_dataset=...)` takes."""
    from datasets import Dataset

    return Dataset.from_list(build_rows(env_name, n, **kwargs))


def _completion_text(completion: Any) -> str:
    """TRL gives a string (standard format) or a list of messages (conversational): the last assistant text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for msg in reversed(completion):
            if isinstance(msg, dict) and msg.get("role", "assistant") == "assistant":
                content = msg.get("content", "")
                if isinstance(content, list):  # multimodal-shaped content
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                return content or ""
    return str(completion)


def _value(result: StepResult, component: str | None) -> float:
    if not result.done:
        return 0.0  # the episode did not finish inside this completion: nothing earned
    if component is None:
        return float(result.reward)
    if component == "success":
        return float(bool(result.success))
    return float(result.components.get(component, 0.0))


def make_reward_func(
    env_name: str,
    *,
    component: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> Callable[..., list[float]]:
    """A TRL reward function scoring completions in `env_name`.

    `component=None` returns the train reward; a component name (or "success") returns that signal,
    for logging next to the reward with weight 0.
    """
    cls = get_env_class(env_name)
    holder: dict[str, Environment] = {}

    def reward_func(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        seeds = kwargs.get("env_seed")
        splits = kwargs.get("env_split") or ["train"] * len(completions)
        options = kwargs.get("env_options") or ["{}"] * len(completions)
        environments = kwargs.get("environments")
        out: list[float] = []
        for i, completion in enumerate(completions):
            text = _completion_text(completion)
            trl_env = environments[i] if environments is not None else None
            if isinstance(trl_env, VrikshaTRLEnv):
                out.append(_value(trl_env._finish(text), component))
                continue
            if seeds is None:
                raise ValueError(
                    "reward_func needs the dataset's `env_seed` column (build the dataset with "
                    "vriksha.envs.trl_adapter.build_dataset) or an environment_factory"
                )
            env = holder.get("env") or holder.setdefault("env", cls(**(env_kwargs or {})))
            opts = {"split": splits[i], **json.loads(options[i] or "{}")}
            driver = EpisodeDriver(env, max_turns=1)  # the completion is the episode's one and final turn
            driver.reset(seed=int(seeds[i]), options=opts)
            try:
                result = driver.act(text)
            except Exception as exc:  # a reward function must not crash the trainer
                logger.warning("%s: step failed (%s); reward 0", cls.name, exc)
                out.append(0.0)
                continue
            out.append(_value(result, component))
        return out

    reward_func.__name__ = f"{cls.name}_{component}" if component else f"{cls.name}_reward"
    reward_func.__qualname__ = reward_func.__name__
    return reward_func


# ---------------------------------------------------------------- environment_factory


class VrikshaTRLEnv:
    """One rollout's environment, shaped for TRL's `environment_factory`.

    Public methods other than `reset` become tools the model may call; everything else is private.
    """

    env_name: str = ""
    env_kwargs: dict[str, Any] = {}

    def __init__(self) -> None:
        self._env = get_env_class(self.env_name)(**self.env_kwargs)
        self._driver = EpisodeDriver(self._env)
        self._last: StepResult | None = None
        self._final: StepResult | None = None

    def reset(self, **kwargs: Any) -> str | None:
        """Start the episode of this dataset row; returns the observation when the row had no prompt for it."""
        seed = kwargs.get("env_seed")
        opts = {"split": kwargs.get("env_split") or "train", **json.loads(kwargs.get("env_options") or "{}")}
        self._last = self._driver.reset(seed=None if seed is None else int(seed), options=opts)
        self._final = None
        return None if seed is not None and "prompt" in kwargs else self._last.observation.text

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._final is not None or self._driver.done:
            return "error: the episode has ended"
        result = self._driver.tool(name, arguments)  # a step when the env's actions are tool calls
        self._last = result
        if result.done:
            self._final = result
        return result.observation.text

    def _finish(self, text: str) -> StepResult:
        """Score the rollout's final text (called by the reward function)."""
        if self._final is None:
            self._final = self._last if self._driver.done else self._driver.act(text)
        return self._final


_JSON_TO_PY = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list}


def _tool_method(tool: Tool) -> Callable[..., str]:
    props = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for key, spec in props.items():
        ann = _JSON_TO_PY.get(spec.get("type", "string"), str)
        annotations[key] = ann
        default = inspect.Parameter.empty if key in required else None
        params.append(
            inspect.Parameter(key, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=ann)
        )
    annotations["return"] = str
    sig = inspect.Signature(params, return_annotation=str)

    def method(self: VrikshaTRLEnv, *args: Any, **kwargs: Any) -> str:
        bound = sig.bind(self, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self" and v is not None}
        return self._call(tool.name, arguments)

    args_doc = "\n".join(f"    {k}: {props[k].get('description') or k}" for k in props)
    method.__name__ = method.__qualname__ = tool.name
    method.__signature__ = sig  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    method.__doc__ = f"{tool.description}\n\nArgs:\n{args_doc}\n\nReturns:\n    The tool's answer as text."
    return method


def environment_factory(env_name: str, **env_kwargs: Any) -> Callable[[], VrikshaTRLEnv]:
    """A zero-argument factory of `VrikshaTRLEnv` subclasses with `env_name`'s tools as methods."""
    cls = get_env_class(env_name)
    probe = cls(**env_kwargs)
    methods = {t.name: _tool_method(t) for t in probe.tools()}
    probe.close()
    clash = set(methods) & {"reset", "get_reward"}
    if clash:
        raise ValueError(f"{env_name}: tool names {sorted(clash)} clash with TRL's environment methods")
    name = "".join(p.title() for p in cls.name.split("_")) + "TRLEnv"
    env_cls = type(name, (VrikshaTRLEnv,), {"env_name": cls.name, "env_kwargs": dict(env_kwargs), **methods})
    return env_cls
