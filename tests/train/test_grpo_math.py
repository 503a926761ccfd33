"""GRPO advantages and the default loss (`grpo.loss_type: dapo`) on hand-computed cases."""

import math

import pytest
import torch

from vriksha.train.config import GRPOConfig
from vriksha.train.grpo import group_advantages
from vriksha.train.losses import DAPOLoss, LossInputs, build_loss, k3_kl


def _on_policy(lp, old, adv, mask, n):
    """Inputs of a batch the engine's numerics match exactly (sampling log-probs = old)."""
    return LossInputs(lp, old, adv, mask, sampling_logprobs=old.detach(), num_tokens_global=n)


def test_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 2.0]])
    out = group_advantages(rewards, scale=True, eps=0.0)
    # group 0: mean 0.5, sample std sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert out.advantages[0].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rel=1e-6)
    # group 1: no variance -> skipped with zero advantage
    assert out.advantages[1].tolist() == [0.0] * 4
    assert out.keep.tolist() == [True, False, True]
    assert out.num_zero_variance == 1
    # group 2: mean 2, sample std sqrt(2/3)
    s2 = math.sqrt(2 / 3)
    assert out.advantages[2].tolist() == pytest.approx([1 / s2, -1 / s2, 0.0, 0.0], rel=1e-6)


def test_advantages_unscaled():
    out = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), scale=False)
    assert out.advantages[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_advantages_reject_bad_shape():
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 2.0]))


def test_k3_kl_values():
    lp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.0, -1.5])
    r = 0.5
    assert k3_kl(lp, ref).tolist() == pytest.approx([0.0, math.exp(r) - r - 1])


def test_loss_on_policy_is_minus_mean_advantage_and_gradient():
    # ratio = 1 (old = current detached): loss = -sum(mask * A) / N_global
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    out = DAPOLoss(clip_low=0.2, clip_high=0.2)(_on_policy(lp, lp.detach(), adv, mask, 6.0))
    loss = out.loss
    assert float(loss) == pytest.approx(-(2.0 + 2.0 - 1.0) / 6.0)
    loss.backward()
    # d loss / d lp = -A * mask / N
    expected = -(adv[:, None] * mask) / 6.0
    assert torch.allclose(lp.grad, expected)
    assert out.tokens == 3 and out.metrics["clip_fraction"] == 0


def test_loss_clipping_separate_bounds():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.5, 0.5 with advantages +1, +1, -1, -1
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    out = DAPOLoss(clip_low=0.2, clip_high=0.28)(_on_policy(lp, old, adv, mask, 4.0))
    loss = out.loss
    # min(r A, clip(r) A): +1,1.5 -> 1.28 (clipped) ; +1,0.5 -> 0.5 ; -1,1.5 -> -1.5 ; -1,0.5 -> -0.8 (clipped)
    assert float(loss) == pytest.approx(-(1.28 + 0.5 - 1.5 - 0.8) / 4.0)
    assert out.metrics["clip_fraction"] == 2
    loss.backward()
    # clipped tokens get no gradient; the others get -A * r / N
    assert lp.grad[0, 0] == 0 and lp.grad[0, 3] == 0
    assert float(lp.grad[0, 1]) == pytest.approx(-0.5 / 4)
    assert float(lp.grad[0, 2]) == pytest.approx(1.5 / 4)


def test_importance_weight_truncated_and_kl_term():
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    engine = torch.tensor([[-1.0 - math.log(4.0), -1.0 + math.log(2.0)]])  # weights 4 -> cap 2, and 0.5
    ref = torch.tensor([[-1.5, -1.0]])
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 2)
    inputs = LossInputs(
        lp, lp.detach(), adv, mask, sampling_logprobs=engine, ref_logprobs=ref, num_tokens_global=2.0
    )
    out = DAPOLoss(clip_low=0.2, clip_high=0.2, kl_coef=0.1, importance_cap=2.0)(inputs)
    kl0 = math.exp(-0.5) + 0.5 - 1
    expected = (2.0 * (-1.0 + 0.1 * kl0) + 0.5 * (-1.0 + 0.0)) / 2.0
    assert float(out.loss) == pytest.approx(expected, rel=1e-6)
    assert out.metrics["importance_weight/mean"] == pytest.approx(2.5)
    assert out.metrics["kl"] == pytest.approx(kl0)


def test_global_normalisation_splits_like_one_batch():
    torch.manual_seed(0)
    lp = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    adv = torch.randn(4)
    n = float(mask.sum())
    loss = DAPOLoss(clip_low=0.2, clip_high=0.2)
    whole = loss(_on_policy(lp, lp, adv, mask, n)).loss
    a = loss(_on_policy(lp[:2], lp[:2], adv[:2], mask[:2], n)).loss
    b = loss(_on_policy(lp[2:], lp[2:], adv[2:], mask[2:], n)).loss
    assert float(a + b) == pytest.approx(float(whole), rel=1e-6)


def test_loss_type_picks_the_registered_loss_and_its_options():
    cfg = GRPOConfig(clip_low=0.1, clip_high=0.3, kl_coef=0.05, importance_correction=False)
    assert cfg.loss_type == "dapo"  # the default: the loss above
    assert build_loss(cfg) == DAPOLoss(0.1, 0.3, 0.05, importance_correction=False, importance_cap=2.0)


def test_without_importance_correction_the_sampling_logprobs_weigh_nothing():
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    far = torch.tensor([[-3.0, 0.0]])  # would give weights 2 (capped) and e^-1
    inputs = LossInputs(lp, lp.detach(), torch.tensor([1.0]), torch.ones(1, 2), sampling_logprobs=far)
    inputs.num_tokens_global = 2.0
    out = DAPOLoss(importance_correction=False)(inputs)
    assert float(out.loss) == pytest.approx(-1.0)
    assert out.metrics["importance_weight/mean"] == 2.0 and out.metrics["logprob_gap/mean"] == 0.0
    assert set(out.metrics) == set(DAPOLoss.metric_names)
