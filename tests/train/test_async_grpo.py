"""Off-policy GRPO (`rollout.max_staleness`): the producer thread plays ahead under older weights, the
staleness bound drops what lags too far, an update never reaches a batch in flight, and a killed run
resumes to what an uninterrupted one trains on."""

from __future__ import annotations

import json
import math
import signal
import threading

import pytest
import torch

from tests.train.trainer_runs import kill_at_checkpoint, metrics_rows, read_rows, run_trainer, write_config
from vriksha.train.async_rollout import (
    AsyncRollout,
    AsyncRolloutError,
    RolloutBatch,
    StalenessStats,
    planned_version,
)
from vriksha.train.rollout import Episode


def _episode(version_tag: int = 0) -> Episode:
    return Episode(group=0, member=0, seed=version_tag, prompt_ids=[1, 2], completion_ids=[3], loss_mask=[1])


# -- the schedule and the bound (no model) -----------------------------------------------


def test_schedule_lags_k_versions_after_warmup():
    assert [planned_version(j, 0, 1) for j in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [planned_version(j, 0, 2) for j in range(1, 6)] == [0, 0, 0, 1, 2]
    # resumed at step 4: the first batches are played under the resumed weights
    assert [planned_version(j, 4, 1) for j in range(5, 8)] == [4, 4, 5]


def test_batch_older_than_max_staleness_is_dropped_and_counted():
    groups = [[_episode()] * 2 for _ in range(3)]
    ok = StalenessStats.of(RolloutBatch(step=5, version=2, groups=groups), trainer_version=4, max_staleness=2)
    assert ok.lag == 2 and ok.dropped == 0 and len(ok.kept) == 3 and ok.histogram == [0, 0, 3]
    old = StalenessStats.of(
        RolloutBatch(step=5, version=1, groups=groups), trainer_version=4, max_staleness=2
    )
    assert old.lag == 3 and old.dropped == 3 and old.kept == [] and old.histogram == [0, 0, 0]
    with pytest.raises(AsyncRolloutError, match="newer than the trainer"):
        StalenessStats.of(RolloutBatch(step=5, version=6, groups=groups), trainer_version=4, max_staleness=2)


def test_batch_round_trips_through_a_checkpoint_dict():
    e = Episode(
        group=1, member=2, seed=7, prompt_ids=[1], completion_ids=[4, 5], engine_logprobs=[-0.1, -1e-9]
    )
    e.loss_mask, e.components = [1, 1], {"correct": 1.0}
    b = RolloutBatch(step=3, version=1, groups=[[e]], seconds=0.5)
    again = RolloutBatch.from_dict(json.loads(json.dumps(b.to_dict())))
    assert again == b


def test_run_summary_sums_the_staleness_histogram():
    from vriksha.train.metrics import rollout_summary

    rows = [
        {"time/step_s": 2.0, "async/staleness_hist": [4, 0], "async/dropped_total": 0},
        {"time/step_s": 1.0, "async/staleness_hist": [0, 4], "async/dropped_total": 0},
        {"time/step_s": 1.0, "async/staleness_hist": [0, 0], "async/dropped_total": 4},
    ]
    out = rollout_summary(rows)
    assert out["staleness_hist"] == [4, 4] and out["staleness_mean"] == 0.5
    assert out["dropped_groups"] == 4 and out["steps_per_hour"] == pytest.approx(2700.0)
    assert set(rollout_summary([{"time/step_s": 1.0}])) == {"steps_per_hour"}  # on-policy runs


def test_max_staleness_config_is_validated():
    from vriksha.errors import ConfigError
    from vriksha.train.config import TrainConfig

    assert TrainConfig.from_dict({}).rollout.max_staleness == 0  # on-policy by default
    assert TrainConfig.from_dict({"rollout": {"max_staleness": 2}}).rollout.max_staleness == 2
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        TrainConfig.from_dict({"rollout": {"max_staleness": -1}})


# -- the partial-rollout rule on a real engine --------------------------------------------


def test_update_published_mid_batch_waits_for_the_next_batch(tiny_model_dir):
    """Half of batch 2 is played, then version 1 (a zero LM head: every token exactly -log V) is
    published, then the other half: all of batch 2 comes from version 0, all of batch 3 from version 1."""
    from vriksha.engine.config import EngineConfig
    from vriksha.loading import load_model
    from vriksha.train.config import EnvConfig, RolloutConfig
    from vriksha.train.rollout import RolloutWorker
    from vriksha.train.rollout_engine import colocated_engine

    loaded = load_model(str(tiny_model_dir), dtype=torch.float32)
    module, tok = loaded.model.eval().requires_grad_(False), loaded.tokenizer
    llm = colocated_engine(module, tok, EngineConfig(kv_cache_memory_gb=0.05))
    cfg = RolloutConfig(group_size=2, max_new_tokens=1)
    env = EnvConfig(name="arithmetic", options={"level": 1})
    half_played, published = threading.Event(), threading.Event()

    def play(engine, step):
        worker = RolloutWorker(engine, tok, env, cfg)
        first = worker.play([10 * step], "train", 2, sampling_seeds=[step])
        if step == 2:
            half_played.set()
            assert published.wait(60)
        return first + worker.play([10 * step + 1], "train", 2, sampling_seeds=[step + 100])

    params = list(module.parameters())
    uniform = [torch.zeros_like(p) if p is module.lm_head.weight else p.detach().clone() for p in params]
    producer = AsyncRollout(llm, params, play, max_staleness=1, start_version=0, last_step=3).start()
    try:
        assert producer.get(1, timeout=120).version == 0
        assert half_played.wait(120)
        producer.publish(1, uniform)
        published.set()
        b2, b3 = producer.get(2, timeout=120), producer.get(3, timeout=120)
    finally:
        producer.close()
        llm.close()
    flat = -math.log(module.lm_head.weight.shape[0])

    def logprobs(batch):
        return [lp for g in batch.groups for e in g for lp in e.engine_logprobs]

    assert b2.version == 0 and b3.version == 1
    assert len(b2.groups) == 2 and len(logprobs(b2)) > 0
    assert all(abs(lp - flat) > 1e-3 for lp in logprobs(b2)), "version 1 leaked into the batch in flight"
    assert all(abs(lp - flat) < 1e-3 for lp in logprobs(b3))
    with pytest.raises(AsyncRolloutError, match="past the last step"):
        producer.get(4)


# -- the trainer end to end ------------------------------------------------------------------


@pytest.mark.slow
def test_async_run_trains_with_bounded_staleness(tiny_model_dir, tmp_path):
    cfg = write_config(
        tmp_path, tiny_model_dir, "async", steps=3, eval_episodes=2, eval_interval=0, export=False
    )
    run_trainer([str(cfg), "--set", "rollout.max_staleness=1"])
    rows = read_rows(tmp_path / "async")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["importance_weight/mean"]) for r in rows)
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1]  # step 1 is played under the start
    assert [r["async/version"] for r in rows] == [0, 0, 1]
    assert all(r["async/staleness_max"] <= 1 and sum(r["async/staleness_hist"]) == 4 for r in rows)
    assert all(r["async/dropped_groups"] == 0 for r in rows)
    assert all(r["perf/steps_per_hour"] > 0 and r["time/rollout_wait_s"] >= 0 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)
    summary = json.loads((tmp_path / "async" / "summary.json").read_text())["rollouts"]
    assert summary["staleness_hist"] == [4, 8] and summary["dropped_groups"] == 0


@pytest.mark.slow
def test_restored_queue_past_a_smaller_bound_is_dropped(tiny_model_dir, tmp_path):
    """Stopped at step 2 with K = 2, the checkpoint holds steps 3 and 4 (versions 0 and 1); resumed with
    K = 1 they lag 2 versions and are dropped, counted, and trained on by no optimizer step."""
    cfg = write_config(
        tmp_path, tiny_model_dir, "shrink", steps=4, eval_episodes=0, eval_interval=0, export=False
    )
    run_trainer([str(cfg), "--set", "rollout.max_staleness=2", "--set", "trainer.stop_after=2"])
    state = json.loads((tmp_path / "shrink" / "checkpoints" / "step_000002" / "trainer.json").read_text())
    assert [(b["step"], b["version"]) for b in state["rollout_queue"]] == [(3, 0), (4, 1)]
    run_trainer([str(cfg), "--resume", "--set", "rollout.max_staleness=1"])
    rows = read_rows(tmp_path / "shrink")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["async/dropped_groups"] for r in rows[2:]] == [4, 4]
    assert rows[-1]["async/dropped_total"] == 8
    assert all(r["grad_norm"] == 0.0 and r["async/staleness_max"] == 2 for r in rows[2:])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_async_run_resumes_to_the_uninterrupted_one(tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "ref", steps=6, eval_episodes=0, checkpoint_interval=1)
    sets = ["--set", "rollout.max_staleness=1", "--set", "trainer.export=false"]
    run_trainer([str(cfg), *sets])
    killed = write_config(tmp_path, tiny_model_dir, "killed", steps=6, eval_episodes=0, checkpoint_interval=1)
    out = tmp_path / "killed"
    assert kill_at_checkpoint([str(killed), *sets], out, step=2) == -signal.SIGKILL
    assert len(read_rows(out)) < 6, "the run finished before it was killed"
    run_trainer([str(killed), "--resume", *sets])
    assert metrics_rows(out) == metrics_rows(tmp_path / "ref")
    assert [r["async/staleness_max"] for r in read_rows(out)] == [0, 1, 1, 1, 1, 1]


@pytest.mark.slow
def test_server_mode_async_pushes_each_version_once(tiny_model_dir, tmp_path):
    cfg = write_config(
        tmp_path, tiny_model_dir, "srv", steps=3, eval_episodes=2, eval_interval=0, export=False
    )
    run_trainer(
        [
            str(cfg),
            "--set",
            "rollout.mode=server",
            "--set",
            "rollout.max_staleness=1",
            "--set",
            "rollout.verify_weights=true",
        ]
    )
    out = tmp_path / "srv"
    rows = read_rows(out)
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1]
    syncs = read_rows(out, "weight_sync.jsonl")
    # version 0 at the start, version 1 before step 3's batch; never during a batch
    assert [s["version"] for s in syncs] == [0, 1]
    assert all(s["bit_equal"] for s in syncs)
