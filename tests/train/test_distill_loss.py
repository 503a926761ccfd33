"""The on-policy distillation loss (`losses/distill.py`) against direct computations in fp64."""

from __future__ import annotations

import torch

from vriksha.train.losses import ImportanceCorrection, LossInputs, ReverseKL


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, t = 3, 5
    logprobs = (-torch.rand(b, t, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    teacher = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    sampling = logprobs.detach() + 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 1, 1, 0]], dtype=torch.float64)
    return logprobs, teacher, sampling, mask


def _inputs(logprobs, teacher, sampling, mask, tokens: float) -> LossInputs:
    return LossInputs(
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        advantages=torch.zeros(logprobs.shape[0], dtype=torch.float64),
        loss_mask=mask,
        sampling_logprobs=sampling,
        teacher_logprobs=teacher,
        num_tokens_global=tokens,
    )


def test_loss_and_gradient_equal_the_direct_computation():
    logprobs, teacher, sampling, mask = _batch()
    tokens = 20.0  # the step's generated tokens (this micro-batch has 10)
    coef, cap = 0.7, 1.05
    loss_fn = ReverseKL(coef, ImportanceCorrection(cap=cap))
    out = loss_fn(_inputs(logprobs, teacher, sampling, mask, tokens))
    (grad,) = torch.autograd.grad(out.loss, logprobs)

    lp = logprobs.detach().clone().requires_grad_(True)
    k = (lp.detach() - teacher) * mask  # reverse KL per sampled token
    w = torch.exp(lp.detach() - sampling).clamp(max=cap)  # pi_old / mu, truncated
    ratio = torch.exp(lp - lp.detach())  # 1, with gradient grad log pi
    direct = (w * ratio * coef * k * mask).sum() / tokens
    (want,) = torch.autograd.grad(direct, lp)
    assert torch.allclose(out.loss, direct, atol=1e-12, rtol=0)
    assert torch.allclose(grad, want, atol=1e-12, rtol=0)
    assert torch.allclose(grad, w * coef * k * mask / tokens, atol=1e-12, rtol=0)  # the closed form
    assert abs(out.metrics["reverse_kl"] - float(k.sum())) < 1e-9
    assert out.tokens == 10.0


def test_its_expectation_is_the_gradient_of_the_exact_reverse_kl():
    """One position, every token of a small vocabulary as a sample weighted by its student probability: the
    weighted sum of the loss's gradients is the gradient of KL(student || teacher) over the full distribution."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), -1)
    student = torch.log_softmax(logits, -1)
    loss_fn = ReverseKL(1.0, ImportanceCorrection(enabled=False))
    total = torch.zeros((), dtype=torch.float64)
    for v in range(7):  # the loss on the sample v, weighted by its probability (detached)
        one = lambda x, v=v: x[v].reshape(1, 1)  # noqa: E731
        out = loss_fn(
            _inputs(
                one(student), one(teacher), one(student.detach()), torch.ones(1, 1, dtype=torch.float64), 1.0
            )
        )
        total = total + student[v].exp().detach() * out.loss
    (estimated,) = torch.autograd.grad(total, logits)
    fresh = torch.log_softmax(logits, -1)
    exact_kl = (fresh.exp() * (fresh - teacher)).sum()
    (exact,) = torch.autograd.grad(exact_kl, logits)
    assert torch.allclose(estimated, exact, atol=1e-12, rtol=0)


def test_a_student_equal_to_its_teacher_has_zero_kl_and_gradient():
    logprobs, _, sampling, mask = _batch(2)
    out = ReverseKL()(_inputs(logprobs, logprobs.detach().clone(), sampling, mask, 10.0))
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    assert out.metrics["reverse_kl"] == 0.0
    assert float(out.loss) == 0.0 and bool((grad == 0).all())
