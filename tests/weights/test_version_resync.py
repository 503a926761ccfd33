"""A server answering under another weight version than the trainer's (behind, or ahead after a trainer
restart) is detected, re-synced and the rollout repeated, never silently trained on."""

from __future__ import annotations

import json

import httpx
import torch

from tests.server.conftest import WEIGHTS
from tests.weights.test_weight_server import PROMPT, _trainer_model
from vriksha.engine.sampling_params import SamplingParams
from vriksha.train.config import ModelConfig, RolloutConfig
from vriksha.train.server_rollout import ServerRollout
from vriksha.weights import WeightSyncClient, digest


def test_server_ahead_or_behind_is_resynced(weight_server, tiny_model_dir, tmp_path):
    from vriksha.loading import load_tokenizer

    url = weight_server.base_url
    model = _trainer_model(tiny_model_dir, seed=11)
    cfg = RolloutConfig(mode="server", servers=[url], weight_backend="shm")
    rollout = ServerRollout(
        cfg, ModelConfig(), model, load_tokenizer(tiny_model_dir), tmp_path, 0, start_version=3
    )
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=6, logprobs=0)
    try:
        rollout.weights_updated()  # the resumed weights: version 3
        first = rollout.generate([{"prompt_token_ids": PROMPT}], [params])[0]
        assert first.weight_version == 3 and len(first.outputs) == 2
        assert all(len(c.token_logprobs) == len(c.token_ids) for c in first.outputs)

        # someone else's weights under a higher version (a restarted trainer, a stale run): ahead
        other = _trainer_model(tiny_model_dir, seed=12)
        rollout.clients[0].close()
        intruder = WeightSyncClient(url, rollout.clients[0].client_id, backend="gloo")
        intruder.push(other, version=9)
        intruder.close()
        rollout.clients[0] = WeightSyncClient(url, intruder.client_id, backend="shm")
        again = rollout.generate([{"prompt_token_ids": PROMPT}], [params])[0]
        assert again.weight_version == 3  # re-synced, then repeated
        assert [c.token_ids for c in again.outputs] == [c.token_ids for c in first.outputs]
        served = httpx.get(f"{url}/weight_digests", headers=WEIGHTS, timeout=60).json()
        assert served == {n: digest(p) for n, p in model.named_parameters()}

        # the server falls behind (restarted on old weights, here: older weights pushed under version 2);
        # the trainer's next push sees it, and the rollout after it runs on the trainer's version
        rollout.clients[0].close()
        stale = WeightSyncClient(url, intruder.client_id, backend="gloo")
        stale.push(other, version=2, rewind=True)
        stale.close()
        rollout.clients[0] = WeightSyncClient(url, intruder.client_id, backend="shm")
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        rollout.weights_updated()
        assert rollout.version == 4
        assert rollout.generate([{"prompt_token_ids": PROMPT}], [params])[0].weight_version == 4
        rows = [json.loads(x) for x in (tmp_path / "weight_sync.jsonl").read_text().splitlines()]
        assert [r["version"] for r in rows] == [3, 3, 4]
        assert rows[1]["server_version_before"] == 9  # the re-sync saw the server ahead
        assert rows[2]["server_version_before"] == 2  # and behind
    finally:
        rollout.close()
