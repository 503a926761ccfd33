"""`model.lora.init_b_std`: B starts as seeded noise (a perturbed student), zero by default (the base model)."""

from __future__ import annotations

import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha.train.config import LoraSection
from vriksha.train.lora import apply_lora


def _logits(std: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    model = tiny_llama(embedded_tokenizer())
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        base = model(x).logits
        apply_lora(model, LoraSection(rank=4, init_b_std=std), seed)
        return base, model(x).logits


def test_noise_in_b_moves_the_model_the_same_way_for_a_seed():
    base, zero = _logits(0.0, 0)
    assert torch.equal(base, zero)
    _, noisy = _logits(0.05, 0)
    _, again = _logits(0.05, 0)
    _, other = _logits(0.05, 1)
    assert not torch.allclose(noisy, base, atol=1e-3)
    assert torch.equal(noisy, again) and not torch.equal(noisy, other)
