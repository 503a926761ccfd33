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
