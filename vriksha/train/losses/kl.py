"""KL estimators between the policy and a reference, per token."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["k3_kl"]


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = ref - logprobs (Schulman's,
    >= 0 and unbiased)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0
