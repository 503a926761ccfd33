"""lm-eval (EleutherAI's harness) against `vriksha serve` with its `local-completions` model, on a small
multiple-choice task defined from local files: its log-likelihood requests (echo + logprobs) succeed and the
accuracy equals the same task scored with Transformers directly on the same model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

TASK_DIR = Path(__file__).parent / "lm_eval_task"
MODEL = "tiny"


def transformers_accuracy(model_dir: Path) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    docs = [json.loads(line) for line in (TASK_DIR / "tiny_mc.jsonl").read_text().splitlines()]
    correct = 0
    for doc in docs:
        ctx = tok.encode(doc["question"], add_special_tokens=False)
        scores = []
        for choice in doc["choices"]:
            whole = tok.encode(doc["question"] + " " + choice, add_special_tokens=False)
            cont = whole[len(ctx) :]
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0].float(), -1)
            scores.append(sum(lp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont)))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == doc["label"])
    return correct / len(docs)


@pytest.mark.slow
def test_lm_eval_local_completions_matches_transformers(server_factory, tiny_model_dir, tmp_path):
    server = server_factory(
        ["--model", str(tiny_model_dir), "--kv-cache-memory-gb", "0.05", "--served-model-name", MODEL]
    )
    task = (
        (TASK_DIR / "tiny_mc.yaml")
        .read_text()
        .replace("tests/server/lm_eval_task/tiny_mc.jsonl", str(TASK_DIR / "tiny_mc.jsonl"))
    )
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny_mc.yaml").write_text(task)
    out = tmp_path / "out"
    args = (
        f"model={MODEL},base_url={server.base_url}/v1/completions,tokenizer_backend=huggingface,"
        f"tokenizer={tiny_model_dir},num_concurrent=1,max_retries=1,tokenized_requests=True"
    )
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
        args,
        "--tasks",
        "vriksha_tiny_mc",
        "--include_path",
        str(tmp_path / "tasks"),
        "--output_path",
        str(out),
        "--batch_size",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = next(out.rglob("results_*.json"))
    acc = json.loads(results.read_text())["results"]["vriksha_tiny_mc"]["acc,none"]
    assert abs(acc - transformers_accuracy(tiny_model_dir)) <= 0.01


def lm_eval_loglikelihoods(
    model: str, model_args: str, batch_size: int, out: Path, tasks: Path
) -> list[float]:
    """Every answer's log-likelihood lm-eval scored (docs in order, choices in order), from its samples file."""
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [
        *(sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args),
        *("--tasks", "vriksha_tiny_mc", "--include_path", str(tasks), "--output_path", str(out)),
        *("--batch_size", str(batch_size), "--log_samples", "--device", "cpu"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    samples = next(out.rglob("samples_vriksha_tiny_mc_*.jsonl"))
    docs = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda d: d["doc_id"])
    return [float(resp[0][0]) for doc in docs for resp in doc["resps"]]


@pytest.mark.slow
def test_lm_eval_scores_on_the_default_server_equal_its_hf_model(server_factory, tmp_path, monkeypatch):
    """The default server (the embedded GGUF, every engine default) scores each answer as lm-eval's `hf` model
    scores the dequantized weights, within 1e-3 nats, at batch sizes 1 and 16 (sixteen prompts per request,
    four requests in flight: other traffic in every engine step)."""
    from vriksha.loading import resolve_model_path

    monkeypatch.delenv("VRIKSHA_DTYPE", raising=False)  # the dtype resolves as a user's does
    weights = resolve_model_path(None)
    server = server_factory(["--served-model-name", MODEL])
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_mc.yaml").write_text(
        (TASK_DIR / "tiny_mc.yaml")
        .read_text()
        .replace("tests/server/lm_eval_task/tiny_mc.jsonl", str(TASK_DIR / "tiny_mc.jsonl"))
    )
    hf = lm_eval_loglikelihoods("hf", f"pretrained={weights},dtype=float32", 16, tmp_path / "hf", tasks)
    for batch, concurrent in ((1, 1), (16, 4)):
        args = (
            f"model={MODEL},base_url={server.base_url}/v1/completions,tokenizer_backend=huggingface,"
            f"tokenizer={weights},num_concurrent={concurrent},max_retries=1,tokenized_requests=True"
        )
        ours = lm_eval_loglikelihoods("local-completions", args, batch, tmp_path / f"served-{batch}", tasks)
        assert len(ours) == len(hf) == 80
        worst = max(abs(a - b) for a, b in zip(ours, hf, strict=True))
        assert worst <= 1e-3, f"batch size {batch}: an answer {worst:.2e} nats from lm-eval's hf model"
