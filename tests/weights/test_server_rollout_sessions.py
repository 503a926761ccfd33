"""Server-mode rollouts carry sessions: every episode's turns send its session id to one `vriksha serve`, which
keeps the episode's prefix pinned between turns (its /metrics gauges show the open sessions), and the episode's
end closes it; the tokens equal those played without sessions. A `PassThroughEngine` passes the sessions on."""

from __future__ import annotations

import pytest

from tests.weights.test_weight_server import _trainer_model
from vriksha.envs import Environment, Observation, StepResult, register_env
from vriksha.envs.play import Sampling, play_groups
from vriksha.envs.registry import make_env, unregister_env
from vriksha.envs.rollout_engine import PassThroughEngine, SessionEngine
from vriksha.train.config import ModelConfig, RolloutConfig
from vriksha.train.server_rollout import ServerRollout

TURNS = 3


class ThreeTurnEnv(Environment):
    """Three turns whatever the model says: each episode continues its own context twice."""

    name = "test_three_turns"
    max_turns = TURNS

    def _reset(self, seed, options):
        text = f"Count from {seed}."
        return Observation(text=text, messages=[{"role": "user", "content": text}])

    def _step(self, action):
        done = self.state.step_count == TURNS
        return StepResult(observation=Observation(text="" if done else "Go on."), reward=0.0, terminated=done)


class Recorder(PassThroughEngine):
    """Keeps every output the engine gave, in order."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.outputs: list = []

    def observe(self, outputs) -> None:
        self.outputs.append(outputs)


class Plain:
    """The same engine through the bare rollout-engine protocol (no sessions)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.eos_token_ids = inner.eos_token_ids

    def generate(self, prompts, sampling_params, use_tqdm=False):
        return self.inner.generate(prompts, sampling_params, use_tqdm=use_tqdm)


@pytest.fixture(scope="module", autouse=True)
def three_turn_env():
    register_env(ThreeTurnEnv)
    yield
    unregister_env(ThreeTurnEnv.name)


@pytest.fixture(scope="module")
def remote(weight_server, tiny_model_dir, tmp_path_factory):
    from vriksha.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    cfg = RolloutConfig(mode="server", servers=[weight_server.base_url], max_new_tokens=6)
    model = _trainer_model(tiny_model_dir, seed=5)
    rollout = ServerRollout(
        cfg, ModelConfig(), model, tok, tmp_path_factory.mktemp("sessions"), 0, start_version=3
    )
    rollout.weights_updated()
    try:
        yield rollout, tok
    finally:
        rollout.close()


def _play(engine, tok, on_turn=None):
    return play_groups(
        engine,
        tok,
        lambda: make_env(ThreeTurnEnv.name),
        [11, 12],
        group_size=2,
        sampling=Sampling(temperature=0.0, max_tokens=6),
        on_turn=on_turn,
    )


def _gauges(server) -> tuple[float, float, float]:
    m = server.metrics()
    return m["vriksha_sessions_open"], m["vriksha_sessions_pinned"], m["vriksha_kv_cache_pinned_tokens"]


def test_episodes_on_a_server_are_sessions_pinned_between_turns(remote, weight_server):
    rollout, tok = remote
    assert isinstance(rollout, SessionEngine)
    engine = Recorder(rollout)
    during: list[tuple[float, float, float]] = []
    groups = _play(engine, tok, on_turn=lambda finished: during.append(_gauges(weight_server)))
    assert len(during) == TURNS
    # after turn 1: each group's session (2); after turns 2 and 3: one per live episode (4), then none
    assert during[0][:2] == (2, 2) and during[0][2] > 0
    assert during[1][:2] == (4, 4) and during[1][2] > during[0][2]
    assert _gauges(weight_server) == (0, 0, 0)  # every session closed by the episode's end
    # each later turn found its episode's whole previous context in the server's cache
    turn1, *later = engine.outputs
    prompts = [len(o.prompt_token_ids) for o in turn1]
    for outs in later:
        for out in outs:
            assert out.num_cached_tokens >= min(prompts)
    # the same episodes, token for token, without sessions
    plain = _play(Plain(rollout), tok)
    for ga, gb in zip(groups, plain, strict=True):
        for ea, eb in zip(ga, gb, strict=True):
            assert ea.turns == TURNS and ea.completion_ids == eb.completion_ids
            assert ea.engine_logprobs == pytest.approx(eb.engine_logprobs, abs=1e-5)
    assert _gauges(weight_server)[0] == 0


def test_a_pass_through_engine_opens_and_closes_sessions_on_the_server(remote, weight_server):
    rollout, _ = remote
    engine = PassThroughEngine(rollout)
    prompt = {"prompt_token_ids": list(range(100, 140))}
    from vriksha import SamplingParams

    out = engine.generate([prompt], [SamplingParams(max_tokens=2, temperature=0.0)], session_id="ep-a/0")
    assert out[0].outputs[0].token_ids
    opened = _gauges(weight_server)
    assert opened[:2] == (1, 1) and opened[2] >= 41
    assert engine.close_session("ep-a/0") is True
    assert engine.close_session("ep-a/0") is False  # no longer open
    assert _gauges(weight_server) == (0, 0, 0)
