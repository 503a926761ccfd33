"""End to end on a tiny random model: 2 processes (gloo) match 1 process; a stopped and resumed run
equals an uninterrupted one; the exported directory loads with Transformers.

The tiny model's output layer only gives weight to the ten digit tokens, and completions are one
token long, so one-digit arithmetic episodes score sometimes and groups carry a learning signal.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, save_model_dir, tiny_llama
from vriksha.train.metrics import MEASURED_PREFIXES

pytestmark = pytest.mark.slow

TIMING = MEASURED_PREFIXES


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    tok = embedded_tokenizer()
    model = tiny_llama(tok, tie_word_embeddings=False)
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    # every prompt ends with the same assistant header, so the last hidden state hardly varies:
    # digit rows along it get logits near 12, every other row 0, so digits take nearly all the mass
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 2 + 3."}], add_generation_prompt=True, tokenize=False
    )
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([tok(prompt)["input_ids"]])).last_hidden_state[0, -1]
        w = model.lm_head.weight
        w.zero_()
        g = torch.Generator().manual_seed(0)
        for d in digits:
            w[d] = 12.0 * h / h.dot(h) + 0.05 * torch.randn(h.shape, generator=g)
    return save_model_dir(model, tok, tmp_path_factory.mktemp("tiny") / "model")


def _config(tmp: Path, model_dir: Path, name: str, **trainer) -> Path:
    import yaml

    cfg = {
        "model": {"path": str(model_dir), "mixed_precision": "none"},  # the runs compared here are fp32
        "env": {"name": "arithmetic", "options": {"level": 1}},
        "rollout": {
            "group_size": 8,
            "prompts_per_step": 4,
            "max_new_tokens": 1,
            "engine": {"kv_cache_memory_gb": 0.05},
        },
        "optim": {"lr": 2.0e-4, "max_grad_norm": 10.0},
        "grpo": {"micro_batch_groups": 1},
        "trainer": {
            "steps": 4,
            "seed": 3,
            "eval_episodes": 4,
            "eval_interval": 2,
            "checkpoint_interval": 2,
            "output_dir": str(tmp / name),
            "tensorboard": False,
            "progress": False,
            **trainer,
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(args: list[str], nproc: int = 1) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1" if nproc > 1 else os.environ.get("OMP_NUM_THREADS", "2")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd += ["-m", "vriksha.train", *args]
    else:
        cmd = [sys.executable, "-m", "vriksha.train", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _evals(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    _run([str(_config(tmp, tiny_model_dir, "full"))])
    return tmp / "full"


def test_single_process_run_learns_and_exports(reference_run):
    rows = _metrics(reference_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the fixture makes rewards vary, so some groups carry signal and the policy moves
    assert any(r["groups/zero_variance"] < r["groups/total"] for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)
    assert [e["step"] for e in _evals(reference_run)] == [0, 2, 4]
    for png in ("reward.png", "eval_success.png"):
        assert (reference_run / png).stat().st_size > 1000
    assert "held-out success" in (reference_run / "summary.md").read_text()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(reference_run / "final")
    tok = AutoTokenizer.from_pretrained(reference_run / "final")
    out = model(input_ids=torch.tensor([tok("Compute 1 + 2.")["input_ids"]]))
    assert torch.isfinite(out.logits).all()


def test_stopped_and_resumed_run_equals_uninterrupted(reference_run, tiny_model_dir, tmp_path):
    cfg = _config(tmp_path, tiny_model_dir, "resumed")
    _run([str(cfg), "--set", "trainer.stop_after=2"])
    out = tmp_path / "resumed"
    assert [r["step"] for r in _metrics(out)] == [1, 2]
    assert not (out / "final").exists()
    _run([str(cfg), "--resume"])
    assert _metrics(out) == _metrics(reference_run)
    assert _evals(out) == _evals(reference_run)


def test_two_processes_match_one(reference_run, tiny_model_dir, tmp_path):
    cfg = _config(tmp_path, tiny_model_dir, "two", steps=3, eval_episodes=0, export=False)
    _run([str(cfg)], nproc=2)
    one, two = _metrics(reference_run)[:3], _metrics(tmp_path / "two")
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
    cfg = _config(tmp_path, tiny_model_dir, "tp", steps=3, eval_episodes=0, export=False)
    _run([str(cfg), "--set", "parallel.tp=2"], nproc=2)
    one, tp = _metrics(reference_run)[:3], _metrics(tmp_path / "tp")
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
