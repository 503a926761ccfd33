"""GRPO advantages and loss on hand-computed cases."""

import math

import pytest
import torch

from vriksha.train.grpo import group_advantages, grpo_token_loss, k3_kl


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
    loss, stats = grpo_token_loss(
        lp, lp.detach(), adv, mask, clip_low=0.2, clip_high=0.2, num_tokens_global=6.0
    )
    assert float(loss) == pytest.approx(-(2.0 + 2.0 - 1.0) / 6.0)
    loss.backward()
    # d loss / d lp = -A * mask / N
    expected = -(adv[:, None] * mask) / 6.0
    assert torch.allclose(lp.grad, expected)
    assert stats.tokens == 3 and stats.clipped == 0


def test_loss_clipping_separate_bounds():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.5, 0.5 with advantages +1, +1, -1, -1
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, stats = grpo_token_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, num_tokens_global=4.0)
    # min(r A, clip(r) A): +1,1.5 -> 1.28 (clipped) ; +1,0.5 -> 0.5 ; -1,1.5 -> -1.5 ; -1,0.5 -> -0.8 (clipped)
    assert float(loss) == pytest.approx(-(1.28 + 0.5 - 1.5 - 0.8) / 4.0)
    assert stats.clipped == 2
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
    loss, stats = grpo_token_loss(
        lp,
        lp.detach(),
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.2,
        num_tokens_global=2.0,
        engine_logprobs=engine,
        importance_cap=2.0,
        ref_logprobs=ref,
        kl_coef=0.1,
    )
    kl0 = math.exp(-0.5) + 0.5 - 1
    expected = (2.0 * (-1.0 + 0.1 * kl0) + 0.5 * (-1.0 + 0.0)) / 2.0
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert stats.importance_weight == pytest.approx(2.5)
    assert stats.kl == pytest.approx(kl0)


def test_global_normalisation_splits_like_one_batch():
    torch.manual_seed(0)
    lp = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    adv = torch.randn(4)
    n = float(mask.sum())
    whole, _ = grpo_token_loss(lp, lp, adv, mask, clip_low=0.2, clip_high=0.2, num_tokens_global=n)
    a, _ = grpo_token_loss(
        lp[:2], lp[:2], adv[:2], mask[:2], clip_low=0.2, clip_high=0.2, num_tokens_global=n
    )
    b, _ = grpo_token_loss(
        lp[2:], lp[2:], adv[2:], mask[2:], clip_low=0.2, clip_high=0.2, num_tokens_global=n
    )
    assert float(a + b) == pytest.approx(float(whole), rel=1e-6)
