"""LoRA runs of the real trainer on the tiny digit model: the adapter alone trains and is checkpointed, the run
ends with an adapter PEFT loads (logits equal to the merged export), a resumed run equals an uninterrupted one,
2 processes (FSDP2, and tensor parallel) match one, servers get the adapter alone, off-policy rollouts run."""

from __future__ import annotations

import json

import pytest
import torch

from tests.train.trainer_runs import eval_rows, metrics_rows, read_rows, run_trainer, write_config

pytestmark = pytest.mark.slow

LORA = ["--set", "model.lora.rank=4", "--set", "model.lora.alpha=8", "--set", "model.lora.lr=2e-3"]


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    run_trainer([str(write_config(tmp, tiny_model_dir, "lora")), *LORA])
    return tmp / "lora"


def _adapter(out):
    from vriksha.lora import load_peft_dir

    return load_peft_dir(out / "adapter")


def test_adapter_trains_alone_and_peft_loads_it_with_the_merged_exports_logits(lora_run, tiny_model_dir):
    from peft import PeftModel
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    rows = metrics_rows(lora_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and any(r["grad_norm"] > 0 for r in rows)
    assert all(r["lr"] == 2e-3 for r in rows)  # model.lora.lr, not optim.lr
    adapter = _adapter(lora_run)
    assert adapter.rank == 4 and len(adapter.modules) == 14  # every projection of the 2 decoder layers
    assert any(float(w.b.abs().max()) > 0 for w in adapter.modules.values())  # B moved from zero
    # the checkpoint holds the adapter and its optimizer state, not the frozen base
    meta = FileSystemReader(str(lora_run / "checkpoints" / "step_000004")).read_metadata()
    model_keys = [k for k in meta.state_dict_metadata if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    assert any(k.startswith("optim.state.") and ".lora_B." in k for k in meta.state_dict_metadata)
    ids = torch.tensor([[1, 42, 7, 99, 314, 2718, 5]])
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(lora_run / "adapter")
    ).eval()
    merged = AutoModelForCausalLM.from_pretrained(lora_run / "final").eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, peft_model(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )


def test_stopped_and_resumed_lora_run_equals_uninterrupted(lora_run, tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "lora")
    run_trainer([str(cfg), *LORA, "--set", "trainer.stop_after=2"])
    out = tmp_path / "lora"
    assert [r["step"] for r in metrics_rows(out)] == [1, 2] and not (out / "adapter").exists()
    run_trainer([str(cfg), *LORA, "--resume"])
    assert metrics_rows(out) == metrics_rows(lora_run)
    assert eval_rows(out) == eval_rows(lora_run)
    a, b = _adapter(out), _adapter(lora_run)
    assert all(torch.equal(a.modules[n].b, b.modules[n].b) for n in a.modules)


@pytest.mark.parametrize("tp", [1, 2])
def test_two_processes_match_one(lora_run, tiny_model_dir, tmp_path, tp):
    cfg = write_config(tmp_path, tiny_model_dir, "lora", steps=3, eval_episodes=0, export=False)
    run_trainer([str(cfg), *LORA, "--set", f"parallel.tp={tp}"], nproc=2)
    one, two = metrics_rows(lora_run)[:3], metrics_rows(tmp_path / "lora")
    assert len(two) == 3
    for a, b in zip(one, two, strict=True):
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-6)
        assert b["groups/zero_variance"] == a["groups/zero_variance"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3, abs=1e-5)


def test_server_mode_moves_the_adapter_alone(tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "server", steps=2, eval_episodes=0, checkpoint_interval=0)
    run_trainer([str(cfg), *LORA, "--set", "rollout.mode=server", "--set", "rollout.verify_weights=true"])
    pushes = [json.loads(x) for x in (tmp_path / "server" / "weight_sync.jsonl").read_text().splitlines()]
    assert [p["version"] for p in pushes] == [0, 1, 2]
    adapter = _adapter(tmp_path / "server")
    for p in pushes:
        assert p["adapter"]["bytes"] == adapter.nbytes == p["sender"]["bytes_copied"]
        assert p["bit_equal"] is True  # the server holds the trainer's adapter, bit for bit
    assert [r["step"] for r in metrics_rows(tmp_path / "server")] == [1, 2]


@pytest.mark.parametrize("mode", ["colocated", "server"])
def test_off_policy_lora_run_publishes_adapters(tiny_model_dir, tmp_path, mode):
    cfg = write_config(tmp_path, tiny_model_dir, "async", steps=3, eval_episodes=2, checkpoint_interval=0)
    run_trainer([str(cfg), *LORA, "--set", "rollout.max_staleness=1", "--set", f"rollout.mode={mode}"])
    rows = read_rows(tmp_path / "async")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/version"] for r in rows] == [0, 0, 1]  # each batch one version behind after the first
    assert (tmp_path / "async" / "adapter" / "adapter_model.safetensors").is_file()
    if mode == "server":
        pushes = [json.loads(x) for x in (tmp_path / "async" / "weight_sync.jsonl").read_text().splitlines()]
        assert pushes and all("adapter" in p for p in pushes)
