"""Every `grpo.loss_type` against TRL's `GRPOTrainer` on fixed fp64 batches: the loss and its gradients with
respect to the log-probs (and the entropy, with a bonus) equal to 1e-6, term by term: the clip, the KL with
and without its ratio correction, the importance-sampling modes, the off-policy sequence mask, the entropy
bonus, one micro-batch and two (gradient accumulation)."""

from __future__ import annotations

import pytest
import torch

from tests.train.trl_reference import Batch, fixed_batch, trl_importance_ratio, trl_loss, trl_trainer
from vriksha.train.config import GRPOConfig
from vriksha.train.losses import LossInputs, build_loss

TOL = 1e-6
SEEDS = (0, 1, 2)

# vriksha's grpo section -> TRL's GRPOConfig
LOSSES = {
    "grpo": ({"loss_type": "grpo"}, {"loss_type": "grpo"}),
    "dr_grpo": ({"loss_type": "dr_grpo", "max_completion_length": 6}, {"loss_type": "dr_grpo"}),
    "dapo": ({"loss_type": "dapo"}, {"loss_type": "dapo"}),
    "bnpo": ({"loss_type": "bnpo"}, {"loss_type": "bnpo"}),
    "gspo": ({"loss_type": "gspo"}, {"loss_type": "grpo", "importance_sampling_level": "sequence"}),
    "cispo": ({"loss_type": "cispo", "cispo_cap": 1.3}, {"loss_type": "cispo", "epsilon_high": 1.3}),
}


def _ours(grpo: dict, batch: Batch, *, micro_batches: float = 1.0, tokens: float | None = None, rows=None):
    cfg = GRPOConfig(**{"clip_low": 0.2, "clip_high": 0.28, "importance_correction": False, **grpo})
    loss = build_loss(cfg)
    inputs = LossInputs(
        logprobs=batch.logprobs,
        old_logprobs=batch.old,
        advantages=batch.advantages,
        loss_mask=batch.mask,
        sampling_logprobs=batch.sampling,
        ref_logprobs=batch.ref,
        entropy=batch.entropy if loss.needs_entropy else None,
        num_tokens_global=float(batch.mask.sum()) if tokens is None else tokens,
        num_sequences_global=float(batch.mask.shape[0]) if rows is None else rows,
        num_micro_batches_global=micro_batches,
    )
    return loss(inputs)


def _trl(options: dict, batch: Batch, importance: bool = False, num_items: float | None = None):
    trainer = trl_trainer(**{"epsilon": 0.2, "epsilon_high": 0.28, **options})
    ratio = trl_importance_ratio(trainer, batch.old, batch.sampling, batch.mask) if importance else None
    items = float(batch.mask.sum()) if num_items is None else num_items
    return trl_loss(trainer, batch, items, ratio)


def _grads(loss: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    lp, ent = torch.autograd.grad(loss, [batch.logprobs, batch.entropy], allow_unused=True)
    return (
        torch.zeros_like(batch.logprobs) if lp is None else lp,
        torch.zeros_like(batch.entropy) if ent is None else ent,
    )


def _assert_same(ours: torch.Tensor, theirs: torch.Tensor, batch: Batch) -> None:
    assert ours.dtype == torch.float64
    assert abs(float(ours.detach()) - float(theirs.detach())) <= TOL, (float(ours), float(theirs))
    (g_lp, g_ent), (t_lp, t_ent) = _grads(ours, batch), _grads(theirs, batch)
    assert torch.allclose(g_lp, t_lp, atol=TOL, rtol=0), (g_lp - t_lp).abs().max()
    assert torch.allclose(g_ent, t_ent, atol=TOL, rtol=0), (g_ent - t_ent).abs().max()
    assert g_lp.abs().sum() > 0  # the comparison saw a gradient


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_and_gradients_equal_trl(name, seed):
    ours_cfg, trl_cfg = LOSSES[name]
    batch = fixed_batch(seed)
    _assert_same(_ours(ours_cfg, batch).loss, _trl(trl_cfg, batch), batch)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("ratio_correction", [True, False])
def test_kl_term_equals_trl(name, ratio_correction):
    ours_cfg, trl_cfg = LOSSES[name]
    batch = fixed_batch(5)
    ours = _ours({**ours_cfg, "kl_coef": 0.07, "kl_importance_correction": ratio_correction}, batch)
    theirs = _trl({**trl_cfg, "beta": 0.07, "use_bias_correction_kl": ratio_correction}, batch)
    _assert_same(ours.loss, theirs, batch)
    assert ours.metrics["kl"] > 0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_entropy_bonus_equals_trl(name):
    ours_cfg, trl_cfg = LOSSES[name]
    batch = fixed_batch(7)
    ours = _ours({**ours_cfg, "entropy_coef": 0.03}, batch)
    theirs = _trl({**trl_cfg, "entropy_coef": 0.03}, batch)
    assert _grads(ours.loss * 1.0, batch)[1].abs().sum() > 0  # the bonus reaches the entropy
    _assert_same(_ours({**ours_cfg, "entropy_coef": 0.03}, batch).loss, theirs, batch)


IMPORTANCE_MODES = [
    # (level, mode, C_min, C_max)
    ("token", "truncate", None, 2.0),
    ("token", "truncate", 0.5, 1.5),
    ("token", "mask", 0.5, 1.5),
    ("sequence", "truncate", None, 3.0),
    ("sequence", "truncate", 0.8, 1.2),
    ("sequence", "mask", 0.5, 2.0),
    ("sequence", "mask", None, 1.1),
]


@pytest.mark.parametrize("level,mode,low,high", IMPORTANCE_MODES)
@pytest.mark.parametrize("name", ["dapo", "grpo", "gspo", "cispo"])
def test_importance_sampling_modes_equal_trl(name, level, mode, low, high):
    ours_cfg, trl_cfg = LOSSES[name]
    for seed in SEEDS:
        batch = fixed_batch(seed, spread=0.2)
        ours = _ours(
            {
                **ours_cfg,
                "importance_correction": True,
                "importance_level": level,
                "importance_mode": mode,
                "importance_min": low,
                "importance_cap": high,
            },
            batch,
        )
        theirs = _trl(
            {
                **trl_cfg,
                "vllm_importance_sampling_mode": f"{level}_{mode}",
                "vllm_importance_sampling_clip_min": low,
                "vllm_importance_sampling_clip_max": high,
            },
            batch,
            importance=True,
        )
        _assert_same(ours.loss, theirs, batch)


def test_importance_modes_report_what_they_cut():
    batch = fixed_batch(0, spread=0.4)
    tokens = float(batch.mask.sum())
    truncated = _ours({"importance_correction": True, "importance_cap": 1.2, "importance_min": 0.8}, batch)
    masked = _ours(
        {
            "importance_correction": True,
            "importance_mode": "mask",
            "importance_cap": 1.2,
            "importance_min": 0.8,
        },
        batch,
    )
    ratio = torch.exp(batch.old - batch.sampling)[batch.mask.bool()]
    outside = float(((ratio < 0.8) | (ratio > 1.2)).sum())
    assert 0 < outside < tokens
    assert truncated.metrics["importance_weight/clipped"] == outside
    assert truncated.metrics["importance_weight/masked"] == 0
    assert masked.metrics["importance_weight/masked"] == outside
    assert masked.metrics["importance_weight/mean"] == pytest.approx(
        float(torch.where((ratio < 0.8) | (ratio > 1.2), 0.0, ratio).sum())
    )


@pytest.mark.parametrize("name", ["dapo", "grpo", "gspo", "bnpo"])
def test_off_policy_sequence_mask_equals_trl(name):
    ours_cfg, trl_cfg = LOSSES[name]
    for seed in SEEDS:
        batch = fixed_batch(seed, spread=0.4)
        ours = _ours({**ours_cfg, "off_policy_mask_threshold": 0.1}, batch)
        theirs = _trl({**trl_cfg, "off_policy_mask_threshold": 0.1}, batch)
        _assert_same(ours.loss, theirs, batch)
    # the mask acts on this batch: some completion with A < 0 and a large KL is dropped
    batch = fixed_batch(1, spread=0.4)
    assert _ours({**ours_cfg, "off_policy_mask_threshold": 0.1}, batch).metrics["off_policy_masked"] > 0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_clip_fractions_equal_trls_metrics(name):
    if name in ("gspo",):
        pytest.skip("TRL reports sequence-level clip fractions per sequence, vriksha per token")
    ours_cfg, trl_cfg = LOSSES[name]
    batch = fixed_batch(3, spread=0.5)
    trainer = trl_trainer(**{"epsilon": 0.2, "epsilon_high": 0.28, **trl_cfg})
    trainer._metrics["train"].clear()
    trl_loss(trainer, batch, float(batch.mask.sum()))
    out = _ours(ours_cfg, batch)
    tokens = float(batch.mask.sum())
    if name == "cispo":
        assert out.metrics["clip_fraction"] / tokens == pytest.approx(
            trainer._metrics["train"]["cispo_clip_ratio"][-1]
        )
        return
    assert out.metrics["clip_fraction/low"] / tokens == pytest.approx(
        trainer._metrics["train"]["clip_ratio/low_mean"][-1]
    )
    assert out.metrics["clip_fraction/high"] / tokens == pytest.approx(
        trainer._metrics["train"]["clip_ratio/high_mean"][-1]
    )
    assert out.metrics["clip_fraction"] > 0


def _split(batch: Batch, rows: slice) -> Batch:
    return Batch(
        batch.logprobs[rows],
        batch.old[rows],
        batch.ref[rows],
        batch.sampling[rows],
        batch.advantages[rows],
        batch.mask[rows],
        batch.entropy[rows],
    )


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_two_micro_batches_equal_trl_gradient_accumulation(name):
    """Two equal micro-batches of one step: the summed losses and gradients equal TRL's with
    gradient_accumulation_steps 2 (dapo and cispo normalise by the tokens of the whole step there too)."""
    ours_cfg, trl_cfg = LOSSES[name]
    batch = fixed_batch(4, rows=8)
    tokens = float(batch.mask.sum())
    parts = [_split(batch, slice(0, 4)), _split(batch, slice(4, 8))]
    ours = sum(
        _ours({**ours_cfg, "entropy_coef": 0.0}, p, micro_batches=2.0, tokens=tokens, rows=8.0).loss
        for p in parts
    )
    trainer_cfg = {**trl_cfg, "gradient_accumulation_steps": 2}
    theirs = sum(_trl(trainer_cfg, p, num_items=tokens) for p in parts)
    _assert_same(ours, theirs, batch)
