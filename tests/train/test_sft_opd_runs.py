"""Runs of `algorithm: sft` and `algorithm: opd` (the real trainer in a subprocess) on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.tiny_llama import embedded_tokenizer, save_model_dir, tiny_llama
from tests.train.conftest import digit_model_dir
from tests.train.test_sft_data import CHAT, TOOLS
from tests.train.trainer_runs import metrics_rows, read_rows, run_trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tok():
    return embedded_tokenizer()


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, tok):
    return save_model_dir(tiny_llama(tok, seed=5), tok, tmp_path_factory.mktemp("student") / "model")


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chat.jsonl"
    lines = [{"messages": CHAT, "tools": TOOLS}]
    lines += [
        {
            "messages": [
                {"role": "user", "content": f"What is {a} + {b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1)]
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _prompt(tok, messages) -> torch.Tensor:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])


def _sft_config(tmp: Path, model: Path, data: Path, name: str, **over) -> Path:
    cfg = {
        "algorithm": "sft",
        "model": {"path": str(model), "mixed_precision": "none"},
        "sft": {"data": [str(data)], "batch_size": 4, "micro_batch_size": 2},
        "optim": {"lr": 2.0e-3},
        "trainer": {
            "steps": 6,
            "seed": 1,
            "checkpoint_interval": 2,
            "output_dir": str(tmp / name),
            "tensorboard": False,
            "progress": False,
        },
    }
    for key, value in over.items():
        section, field = key.split("__")
        cfg.setdefault(section, {})[field] = value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_sft_lowers_the_loss_and_its_export_loads_in_transformers(tmp_path, student_dir, chat_data, tok):
    from transformers import AutoModelForCausalLM

    run_trainer([str(_sft_config(tmp_path, student_dir, chat_data, "full"))])
    rows = read_rows(tmp_path / "full")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, [r["loss"] for r in rows]
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "final")
    start = AutoModelForCausalLM.from_pretrained(student_dir)
    ids = _prompt(tok, CHAT[:2])
    target = tok(CHAT[2]["content"] + tok.eos_token, add_special_tokens=False)["input_ids"]

    def nll(model) -> float:  # of the first assistant turn, which the run trained on
        full = torch.cat([ids, torch.tensor([target])], dim=1)
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0, ids.shape[1] - 1 : -1].double(), -1)
        return -float(logp.gather(-1, torch.tensor(target)[:, None]).mean())

    assert nll(trained) < nll(start) - 0.5


def test_a_resumed_sft_run_equals_the_uninterrupted_one(tmp_path, student_dir, chat_data):
    from safetensors.torch import load_file

    run_trainer([str(_sft_config(tmp_path, student_dir, chat_data, "whole"))])
    parted = _sft_config(tmp_path, student_dir, chat_data, "parted")
    run_trainer([str(parted), "--set", "trainer.stop_after=2"])
    assert [r["step"] for r in read_rows(tmp_path / "parted")] == [1, 2]
    run_trainer([str(parted), "--resume"])
    assert metrics_rows(tmp_path / "parted") == metrics_rows(tmp_path / "whole")
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "parted" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sft_with_lora_saves_a_peft_adapter_and_the_merged_model(tmp_path, student_dir, chat_data):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = _sft_config(tmp_path, student_dir, chat_data, "lora", model__lora={"rank": 4, "lr": 1.0e-2})
    run_trainer([str(cfg), "--set", "trainer.steps=4"])
    rows = read_rows(tmp_path / "lora")
    assert rows[-1]["loss"] < rows[0]["loss"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "final")
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(student_dir), tmp_path / "lora" / "adapter"
    )
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(merged(x).logits, peft(x).logits, atol=1e-4)
        assert not torch.allclose(
            merged(x).logits, AutoModelForCausalLM.from_pretrained(student_dir)(x).logits
        )


def _opd_config(
    tmp: Path, student: Path, teacher: Path, name: str, steps: int, lr: float, prompts: int = 2
) -> Path:
    cfg = {
        "algorithm": "opd",
        "model": {"path": str(student), "mixed_precision": "none"},
        "opd": {"teacher": str(teacher)},
        "env": {"name": "arithmetic", "options": {"level": 1}},
        "rollout": {
            "group_size": 8,
            "prompts_per_step": prompts,
            "max_new_tokens": 1,
            "engine": {"kv_cache_memory_gb": 0.05},
        },
        "optim": {"lr": lr},
        "trainer": {
            "steps": steps,
            "seed": 2,
            "eval_episodes": 0,
            "output_dir": str(tmp / name),
            "tensorboard": False,
            "progress": False,
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def digit_teacher(tmp_path_factory):
    return digit_model_dir(tmp_path_factory.mktemp("teacher") / "model")


def test_a_student_equal_to_its_teacher_has_zero_kl(tmp_path, digit_teacher):
    # one step: Adam turns the rounding-level gradient of this step into a full-size move of the next
    run_trainer([str(_opd_config(tmp_path, digit_teacher, digit_teacher, "same", steps=1, lr=1e-2))])
    (row,) = read_rows(tmp_path / "same")
    assert row["completion_tokens/mean"] == 1.0
    # zero up to fp32 rounding: the policy's forward runs under FSDP2 with the update's entropy pass, the
    # teacher's without, so a sum may round apart in the last bit
    assert abs(row["reverse_kl"]) < 1e-6 and abs(row["loss"]) < 1e-6 and row["grad_norm"] < 1e-4, row


def test_on_policy_distillation_lowers_the_kl_to_the_teacher(tmp_path, digit_teacher, tok):
    """The student: the teacher with its digit logits rescaled (it prefers the high digits); the exact KL over
    the whole vocabulary at the first answer token of held-out prompts falls."""
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(digit_teacher)
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():
        for i, d in enumerate(digits):
            student.lm_head.weight[d] *= 0.6 + 0.08 * i
    student_dir = save_model_dir(student, tok, tmp_path / "student")
    run_trainer([str(_opd_config(tmp_path, student_dir, digit_teacher, "opd", steps=10, lr=1e-3, prompts=4))])
    assert all(r["reverse_kl"] > 0 for r in read_rows(tmp_path / "opd")[:1])
    teacher = AutoModelForCausalLM.from_pretrained(digit_teacher)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "opd" / "final")

    def kl(model) -> float:
        total = 0.0
        for a, b in [(2, 3), (4, 1), (6, 2)]:
            msg = [{"role": "user", "content": f"Compute {a} + {b}."}]
            ids = _prompt(tok, msg)
            with torch.no_grad():
                p = torch.log_softmax(model(ids).logits[0, -1].double(), -1)
                q = torch.log_softmax(teacher(ids).logits[0, -1].double(), -1)
            total += float((p.exp() * (p - q)).sum())
        return total / 3

    before, after = kl(student), kl(trained)
    assert after < 0.5 * before, (before, after)


def test_a_served_teacher_scores_as_the_local_one(tmp_path, digit_teacher, tok):
    """`opd.teacher: http://...`: the server's echo log-probs of the student's tokens equal the teacher's own
    forward (within the engine's rounding), padding and uneven lengths included."""
    from transformers import AutoModelForCausalLM

    from tests.server.conftest import ServerProcess
    from vriksha.envs.play import Episode
    from vriksha.train.batch import collate_groups
    from vriksha.train.config import OPDConfig
    from vriksha.train.logprobs import completion_logprobs
    from vriksha.train.teacher import RemoteTeacher

    prompts = [_prompt(tok, [{"role": "user", "content": f"Compute {a} + 1."}])[0].tolist() for a in (2, 5)]
    completions = [[[20, 21, 22], [23]], [[24, 25], [26, 27, 28, 29]]]
    groups = [
        [Episode(g, m, 0, prompts[g], c, [0.0] * len(c), [1] * len(c)) for m, c in enumerate(completions[g])]
        for g in range(2)
    ]
    batch = collate_groups(groups, [[0.0, 0.0], [0.0, 0.0]], tok.pad_token_id)
    local = completion_logprobs(AutoModelForCausalLM.from_pretrained(digit_teacher).eval(), batch).logprobs
    server = ServerProcess(["--model", str(digit_teacher)], tmp_path / "server.log")
    try:
        remote = RemoteTeacher(OPDConfig(teacher=server.base_url), tok)(batch)
    finally:
        server.stop()
    mask = batch.completion_mask.bool()
    assert torch.allclose(remote[mask], local.detach()[mask], atol=2e-3), (remote[mask], local[mask])
