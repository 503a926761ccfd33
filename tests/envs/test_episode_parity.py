"""The same environment, seed and model give the same episode and score through every path:
`vriksha env eval` (`evaluate`), the trainer's rollouts and held-out evaluation (`RolloutWorker.play`),
the TRL adapter's reward functions and the OpenEnv bridge. The model is a tiny random Llama, greedy."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vriksha.envs import Environment, Observation, StepResult, StopConditions, get_env_class, register_env
from vriksha.envs.episode import ActionShape
from vriksha.envs.eval import evaluate
from vriksha.envs.openenv_compat import from_openenv
from vriksha.envs.play import Sampling, play_groups
from vriksha.envs.registry import unregister_env
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app
from vriksha.envs.trl_adapter import build_rows, make_reward_func
from vriksha.train.config import EnvConfig, RolloutConfig
from vriksha.train.rollout import RolloutWorker

llm_mod = pytest.importorskip(
    "vriksha.engine.core.llm", reason="the engine (vriksha.engine.core.llm) has not landed"
)
pytestmark = pytest.mark.timeout(300)

SEED, EPISODES, MAX_TOKENS = 40, 3, 8


class GradedEnv(Environment):
    """Two turns, graded by the completions' lengths, generation stopped at an "s": the score follows
    the text, so any difference between the paths' episodes shows in it."""

    name = "test_graded"
    max_turns = 2

    def _reset(self, seed, options):
        text = f"Describe the number {seed}."
        return Observation(
            text=text, messages=[{"role": "user", "content": text}], stop=StopConditions(strings=["s"])
        )

    def _step(self, action):
        n = len(action.text)
        if self.state.step_count == 1:
            return StepResult(observation=Observation(text="Once more, shorter."), reward=(n % 5) / 10)
        return StepResult(
            observation=Observation(),
            reward=(n % 7) / 10,
            terminated=True,
            components={"length": n / 100, "ends_with_s": float(action.text.endswith("s"))},
            success=n % 2 == 0,
        )


@pytest.fixture(scope="module", autouse=True)
def graded_env():
    register_env(GradedEnv)
    yield
    unregister_env(GradedEnv.name)


@pytest.fixture(scope="module")
def tiny():
    from tests.tiny_llama import embedded_tokenizer, tiny_llama

    tok = embedded_tokenizer()
    model = tiny_llama(tok, seed=3, max_position_embeddings=2048, bos_token_id=tok.bos_token_id)
    return llm_mod.LLM.from_module(model.eval(), tok, enable_prefix_caching=False), tok


class OpenEnvSession:
    """A remote episode over the OpenEnv bridge's WebSocket (`/ws`), shaped for the episode driver."""

    def __init__(self, base_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(base_url.replace("http://", "ws://") + "/ws", open_timeout=10)

    def _ask(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        self.ws.send(json.dumps({"type": kind, "data": data}))
        reply = json.loads(self.ws.recv(timeout=30))
        assert reply["type"] == "observation", reply
        return reply["data"]

    def reset(self, seed=None, options=None):
        return from_openenv(self._ask("reset", {"seed": seed, "options": options or {}}))

    def step(self, action):
        return from_openenv(self._ask("step", dict(action)))

    def call_tool(self, name, arguments=None):
        return self._ask("step", {"type": "call_tool", "tool_name": name, "arguments": arguments or {}})

    def close(self) -> None:
        self.ws.close()


def _summary(reward, components, success, turns):
    return (round(reward, 9), {k: round(v, 9) for k, v in components.items()}, bool(success), turns)


def _through_eval(llm, name):
    res = evaluate(
        name, llm, episodes=EPISODES, seed=SEED, split="test", max_tokens=MAX_TOKENS, progress=False
    )
    return res.records, [_summary(r.reward, r.components, r.success, r.turns) for r in res.records]


def _through_trainer(llm, tok, name):
    worker = RolloutWorker(
        llm, tok, EnvConfig(name=name), RolloutConfig(max_new_tokens=MAX_TOKENS, max_turns=8)
    )
    seeds = list(range(SEED, SEED + EPISODES))
    held_out = worker.play(seeds, "test", 1, greedy=True)  # what GRPOTrainer.evaluate runs
    grouped = worker.play(seeds, "test", 2, greedy=True, sampling_seeds=[1, 2, 3])  # a rollout, greedy
    return held_out, grouped


def _through_openenv(llm, tok, name):
    cls = get_env_class(name)
    with ServerThread(create_app(cls, EnvServerConfig(max_sessions=4))) as url:
        groups = play_groups(
            llm,
            tok,
            lambda: OpenEnvSession(url),
            list(range(SEED, SEED + EPISODES)),
            options={"split": "test"},
            sampling=Sampling(max_tokens=MAX_TOKENS, logprobs=False),
            action_shape=ActionShape.from_schema(cls.schemas()["action"]),
        )
    return [g[0] for g in groups]


@pytest.mark.parametrize("name", ["arithmetic", "test_graded"])
def test_eval_trainer_and_openenv_paths_play_the_same_episodes(tiny, name):
    llm, tok = tiny
    records, scores = _through_eval(llm, name)
    held_out, grouped = _through_trainer(llm, tok, name)
    remote = _through_openenv(llm, tok, name)
    if name == "test_graded":  # two turns each, the stop string honoured on every path
        assert all(r.turns == 2 for r in records)
        assert any(c.endswith("s") for r in records for c in r.completions)
        assert len({s[0] for s in scores}) > 1  # the scores differ between episodes: they follow the text
    for i, rec in enumerate(records):
        (ep,) = held_out[i]
        assert _summary(ep.reward, ep.components, ep.success, ep.turns) == scores[i]
        assert ep.text == rec.completions[-1]
        for member in grouped[i]:  # greedy: every member of a group plays the same episode
            assert (member.prompt_ids, member.completion_ids) == (ep.prompt_ids, ep.completion_ids)
            assert member.reward == ep.reward
        played = remote[i]
        assert played.completions == rec.completions
        assert _summary(played.reward, played.components, played.success, played.turns) == scores[i]
        assert played.prompt_ids == ep.prompt_ids and played.completion_ids == ep.completion_ids


def test_trl_reward_functions_score_what_eval_scores(tiny):
    from vriksha.engine.core.sampling_params import SamplingParams

    llm, tok = tiny
    records, _ = _through_eval(llm, "arithmetic")
    rows = build_rows("arithmetic", EPISODES, split="test", seed=SEED)
    prompts = [r["prompt"] for r in rows]
    ids = [
        tok(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
        for p in prompts
    ]
    outs = llm.generate(
        [{"prompt_token_ids": x} for x in ids], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    )
    completions = [[{"role": "assistant", "content": o.outputs[0].text}] for o in outs]
    assert [c[0]["content"] for c in completions] == [r.completions[0] for r in records]
    kw = {k: [r[k] for r in rows] for k in ("env_seed", "env_split", "env_options")}
    assert make_reward_func("arithmetic")(prompts, completions, **kw) == pytest.approx(
        [r.reward for r in records]
    )
    success = make_reward_func("arithmetic", component="success")(prompts, completions, **kw)
    assert success == [float(r.success) for r in records]
    for comp in ("length_ok", "correct", "format"):
        got = make_reward_func("arithmetic", component=comp)(prompts, completions, **kw)
        assert got == pytest.approx([r.components[comp] for r in records])
