"""The update's compute dtype: bf16 autocast over fp32 master weights where this machine's bf16 is measured
faster (the engine's dtype measurement), fp32 where it is not; forced by `model.mixed_precision`; reported."""

from __future__ import annotations

import json

import pytest
import torch

import vriksha.device as devices
from tests.tiny_llama import embedded_tokenizer, tiny_llama
from tests.train.trainer_runs import run_trainer, write_config
from vriksha.engine.platform import compute_dtype
from vriksha.errors import ConfigError
from vriksha.train.config import load_config
from vriksha.train.losses import ImportanceCorrection, LossInputs, PolicyLoss
from vriksha.train.precision import resolve_precision

pytestmark = pytest.mark.usefixtures("measured_auto")


@pytest.fixture
def measured_auto(monkeypatch):
    """auto measures here (the suite pins it to fp32 elsewhere, tests/conftest.py)."""
    monkeypatch.delenv("VRIKSHA_DTYPE", raising=False)


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(tokenizer, tie_word_embeddings=False)


def _nll_and_loss(model, ids, old, precision):
    model.zero_grad(set_to_none=True)
    with precision.autocast(devices.host()):
        logits = model(input_ids=ids).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask = torch.ones_like(lp)
        adv = torch.tensor([1.0, -0.5])
        inputs = LossInputs(lp, old, adv, mask, sampling_logprobs=old, num_tokens_global=float(mask.sum()))
        loss = PolicyLoss(clip_low=0.2, clip_high=0.2, importance=ImportanceCorrection(enabled=False))(
            inputs
        ).loss
    loss.backward()
    return lp, loss


def test_autocast_gives_a_finite_loss_close_to_fp32_with_fp32_masters(model):
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    fp32 = resolve_precision("none", model, devices.host())
    bf16 = resolve_precision("autocast", model, devices.host())
    assert (fp32.mode, bf16.mode) == ("fp32", "bf16-autocast")
    with torch.no_grad():
        old = (
            torch.log_softmax(model(input_ids=ids).logits[:, :-1], -1)
            .gather(-1, ids[:, 1:, None])
            .squeeze(-1)
        )
    lp32, loss32 = _nll_and_loss(model, ids, old, fp32)
    grads32 = [p.grad.clone() for p in model.parameters()]
    lp16, loss16 = _nll_and_loss(model, ids, old, bf16)
    assert torch.isfinite(loss16) and loss16.dtype == torch.float32
    assert (lp16 - lp32).abs().max() < 0.1  # bf16 rounding of ~ -10.8 nats per token
    loss16, loss32 = float(loss16.detach()), float(loss32.detach())
    assert loss16 == pytest.approx(loss32, abs=0.02)
    assert loss16 != loss32  # the forward did run in bf16
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32  # fp32 masters and gradients
        assert torch.isfinite(p.grad).all()
    cos = torch.nn.functional.cosine_similarity(
        torch.cat([p.grad.flatten() for p in model.parameters()]),
        torch.cat([g.flatten() for g in grads32]),
        dim=0,
    )
    assert cos > 0.95


def test_auto_follows_the_measured_choice(model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    chosen = resolve_precision("auto", model, devices.host())
    assert chosen.how == "measured" and chosen.choice is not None
    timings = {k: chosen.choice.timings[k] for k in ("float32", "bfloat16")}
    faster = compute_dtype.pick(timings)  # the faster of the two as measured (with the margin)
    assert chosen.mode == ("bf16-autocast" if faster == "bfloat16" else "fp32")
    again = resolve_precision("auto", model, devices.host())
    assert (again.mode, again.how) == (chosen.mode, "cached")
    assert chosen.mode in chosen.describe() and "CPU flags" in chosen.describe()
    assert resolve_precision("bfloat16", model, devices.host()).fsdp_param_dtype == torch.bfloat16
    half = tiny_llama(tokenizer).to(torch.bfloat16)
    assert resolve_precision("auto", half, devices.host()).mode == "bfloat16"  # no fp32 masters to keep


def test_the_option_is_validated_and_defaults_to_auto():
    assert load_config(None, []).model.mixed_precision == "auto"
    assert load_config(None, ["model.mixed_precision=autocast"]).model.mixed_precision == "autocast"
    with pytest.raises(ConfigError, match="mixed_precision"):
        load_config(None, ["model.mixed_precision=fp8"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_trainer_reports_the_chosen_mode(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected = resolve_precision("auto", policy, devices.host()).mode  # measured here, or from the cache
    cfg = write_config(tmp_path, tiny_model_dir, "auto", steps=1, eval_episodes=0, export=False)
    run_trainer([str(cfg), "--set", "model.mixed_precision=auto"])
    rows = [json.loads(x) for x in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()]
    assert [r["precision"] for r in rows] == [expected]
