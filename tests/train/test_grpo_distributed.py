"""End to end on a tiny random model: 2 processes (gloo) match 1 process; a stopped and resumed run
equals an uninterrupted one; the exported directory loads with Transformers.

The tiny model (`tiny_model_dir`, tests/train/conftest.py) gives weight only to the ten digit tokens, so
one-digit arithmetic episodes score sometimes and groups carry a learning signal.
"""

import json

import pytest
import torch

from tests.train.trainer_runs import eval_rows, metrics_rows, run_trainer, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    run_trainer([str(write_config(tmp, tiny_model_dir, "full"))])
    return tmp / "full"


def test_single_process_run_learns_and_exports(reference_run):
    rows = metrics_rows(reference_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the fixture makes rewards vary, so some groups carry signal and the policy moves
    assert any(r["groups/zero_variance"] < r["groups/total"] for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)
    assert [e["step"] for e in eval_rows(reference_run)] == [0, 2, 4]
    for png in ("reward.png", "eval_success.png"):
        assert (reference_run / png).stat().st_size > 1000
    assert "held-out success" in (reference_run / "summary.md").read_text()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(reference_run / "final")
    tok = AutoTokenizer.from_pretrained(reference_run / "final")
    out = model(input_ids=torch.tensor([tok("Compute 1 + 2.")["input_ids"]]))
    assert torch.isfinite(out.logits).all()


def test_stopped_and_resumed_run_equals_uninterrupted(reference_run, tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "resumed")
    run_trainer([str(cfg), "--set", "trainer.stop_after=2"])
    out = tmp_path / "resumed"
    assert [r["step"] for r in metrics_rows(out)] == [1, 2]
    assert not (out / "final").exists()
    run_trainer([str(cfg), "--resume"])
    assert metrics_rows(out) == metrics_rows(reference_run)
    assert eval_rows(out) == eval_rows(reference_run)


def test_two_processes_match_one(reference_run, tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "two", steps=3, eval_episodes=0, export=False)
    run_trainer([str(cfg)], nproc=2)
    one, two = metrics_rows(reference_run)[:3], metrics_rows(tmp_path / "two")
    assert len(two) == 3
    for a, b in zip(one, two, strict=True):
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-6)
        assert b["groups/zero_variance"] == a["groups/zero_variance"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3, abs=1e-5)
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-3)
    measured = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[-1])
    # every rank reports its own peak resident memory: a whole model process is well above 50 MiB
    assert 0.05 < measured["memory/rank0_peak_rss_gb"] < 64
    assert 0.05 < measured["memory/rank1_peak_rss_gb"] < 64


def test_tensor_parallel_matches_one(reference_run, tiny_model_dir, tmp_path):
    """`--set parallel.tp=2` on 2 processes: both ranks train one batch split by heads and columns;
    rollouts, the engine's gathered weights and the metrics are those of one process."""
    cfg = write_config(tmp_path, tiny_model_dir, "tp", steps=3, eval_episodes=0, export=False)
    run_trainer([str(cfg), "--set", "parallel.tp=2"], nproc=2)
    one, tp = metrics_rows(reference_run)[:3], metrics_rows(tmp_path / "tp")
    assert len(tp) == 3
    for a, b in zip(one, tp, strict=True):
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-6)
        assert b["groups/total"] == a["groups/total"]
        assert b["groups/zero_variance"] == a["groups/zero_variance"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3, abs=1e-5)
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-3)
    state = json.loads((tmp_path / "tp" / "checkpoints" / "step_000003" / "trainer.json").read_text())
    assert state["mesh"] == "1x2"
