"""Episodes played on a server equal episodes played on a colocated engine over the same weights, token for
token (the trainer's RolloutWorker, either way)."""

from __future__ import annotations

import pytest

from tests.weights.test_weight_server import _trainer_model
from vriksha.train.config import EnvConfig, ModelConfig, RolloutConfig
from vriksha.train.rollout import RolloutWorker
from vriksha.train.server_rollout import ServerRollout


def test_server_episodes_equal_colocated(weight_server, tiny_model_dir, tmp_path):
    from vriksha.engine.core.llm import LLM
    from vriksha.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = _trainer_model(tiny_model_dir, seed=31)
    cfg = RolloutConfig(mode="server", servers=[weight_server.base_url], max_new_tokens=8, max_turns=2)
    env = EnvConfig(name="arithmetic", options={"level": 1})
    remote = ServerRollout(cfg, ModelConfig(), model, tok, tmp_path, 0, start_version=40)
    try:
        remote.weights_updated()
        local = LLM.from_module(model, tok, kv_cache_memory_gb=0.05, max_model_len=512)
        a = RolloutWorker(remote, tok, env, cfg).play([1, 2, 3], "train", 2, greedy=True)
        b = RolloutWorker(local, tok, env, cfg).play([1, 2, 3], "train", 2, greedy=True)
        assert remote.eos_token_ids == frozenset(local.eos_token_ids)
        for ga, gb in zip(a, b, strict=True):
            for ea, eb in zip(ga, gb, strict=True):
                assert ea.prompt_ids == eb.prompt_ids
                assert ea.completion_ids == eb.completion_ids and ea.loss_mask == eb.loss_mask
                assert ea.engine_logprobs == pytest.approx(eb.engine_logprobs, abs=1e-4)
                assert ea.reward == eb.reward
    finally:
        remote.close()
