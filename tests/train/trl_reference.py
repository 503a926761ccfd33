"""TRL's own GRPO loss on fixed batches: a real `trl.GRPOTrainer` (a tiny random Llama, CPU) whose
`_compute_loss` runs with the per-token log-probs and entropies handed to it instead of a model forward,
and TRL's importance-sampling ratio (`vllm_importance_sampling_mode`) computed by the block of its
`_generate_and_score_completions` that does it, executed from TRL's installed source."""

from __future__ import annotations

import functools
import inspect
import math
import os
import tempfile
import textwrap
from dataclasses import dataclass

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

trl = pytest.importorskip("trl")
if not hasattr(trl.GRPOConfig, "vllm_importance_sampling_mode"):  # pragma: no cover
    pytest.skip("this TRL has no vllm_importance_sampling_mode (TRL >= 1.0)", allow_module_level=True)

NUM_GENERATIONS = 2


@dataclass
class Batch:
    """One micro-batch as both sides see it: fp64 per-token tensors [B, T]."""

    logprobs: torch.Tensor  # a leaf with requires_grad
    old: torch.Tensor
    ref: torch.Tensor
    sampling: torch.Tensor
    advantages: torch.Tensor  # [B]
    mask: torch.Tensor  # int, 1 on generated tokens
    entropy: torch.Tensor  # a leaf with requires_grad


def fixed_batch(seed: int, rows: int = 4, length: int = 6, spread: float = 0.3) -> Batch:
    """Uneven lengths (one a single token, one with an environment token inside), padding holding garbage,
    ratios and engine gaps wide enough to cross every clip and cap, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    d = torch.float64
    old = -torch.rand(rows, length, generator=g, dtype=d) * 3 - 0.05
    lengths = [length, 3, 1, 4] + [2] * max(0, rows - 4)
    mask = torch.zeros(rows, length, dtype=torch.int64)
    for i, n in enumerate(lengths[:rows]):
        mask[i, :n] = 1
    if rows > 3:
        mask[3, 1] = 0  # an environment token between generated ones
    lp = (old + spread * torch.randn(rows, length, generator=g, dtype=d)).requires_grad_(True)
    sampling = old + spread * 2 * torch.randn(rows, length, generator=g, dtype=d)
    sampling = torch.where(mask.bool(), sampling, torch.zeros_like(sampling))  # as the collated batch has
    ref = old + spread * torch.randn(rows, length, generator=g, dtype=d)
    adv = torch.randn(rows, generator=g, dtype=d)
    entropy = (torch.rand(rows, length, generator=g, dtype=d) * 2).requires_grad_(True)
    return Batch(lp, old, ref, sampling, adv, mask, entropy)


@functools.cache
def _tiny():
    from tests.tiny_llama import embedded_tokenizer, tiny_llama

    tok = embedded_tokenizer()
    tok.padding_side = "left"
    return tiny_llama(tok, max_position_embeddings=256), tok


@functools.cache
def trl_trainer(**options):
    """A `GRPOTrainer` built by TRL from a `GRPOConfig` with `options` (cached per options). A KL coefficient
    (`beta`) is set on the built trainer: with it in the config TRL would load a reference model by name,
    which `_compute_loss` never uses (it reads `ref_per_token_logps` from its inputs)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = _tiny()
    accumulation = options.pop("gradient_accumulation_steps", 1)
    beta = options.pop("beta", 0.0)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-ref-"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulation,
        num_generations=NUM_GENERATIONS,
        max_completion_length=options.pop("max_completion_length", 6),
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        **options,
    )

    def zero_reward(prompts, completions, **kw):
        return [0.0] * len(prompts)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[zero_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1 + 1 ="] * 8}),
        processing_class=tok,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.beta = beta
    return trainer


def trl_importance_ratio(
    trainer, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`vllm_importance_sampling_ratio` as TRL's `_generate_and_score_completions` computes it: the block under
    `if self.use_vllm and self.vllm_importance_sampling_correction:` that starts from `completion_mask`, cut
    from TRL's source and executed with this batch's tensors."""
    from trl import GRPOTrainer

    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    head = "if self.use_vllm and self.vllm_importance_sampling_correction:"
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if line.strip() == head and "completion_mask" in lines[i + 1] and "mask =" in lines[i + 1]
        ),
        None,
    )
    assert start is not None, (
        "TRL's importance-sampling block was not found: update tests/train/trl_reference.py"
    )
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    namespace = {
        "self": trainer,
        "torch": torch,
        "math": math,
        "old_per_token_logps": old,
        "sampling_per_token_logps": sampling,
        "completion_mask": mask,
        "tool_mask": None,
    }
    saved = trainer.use_vllm, trainer.vllm_importance_sampling_correction
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    try:
        exec(compile(textwrap.dedent("\n".join(block)), "trl-importance-block", "exec"), namespace)
    finally:
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = saved
    return namespace["vllm_importance_sampling_ratio"]


def trl_loss(
    trainer, batch: Batch, num_items: float, importance_ratio: torch.Tensor | None = None
) -> torch.Tensor:
    """TRL's `_compute_loss` on `batch` (the model forward replaced by the batch's log-probs and entropies)."""
    rows, length = batch.mask.shape

    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kw):
        assert logits_to_keep == length
        return batch.logprobs, batch.entropy, None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, length, dtype=torch.long),
        "completion_mask": batch.mask,
        "advantages": batch.advantages,
        "old_per_token_logps": batch.old,
        "ref_per_token_logps": batch.ref,
        "sampling_per_token_logps": batch.sampling,
        "num_items_in_batch": torch.tensor(float(num_items), dtype=torch.float64),
    }
    saved = trainer.use_vllm, trainer.vllm_importance_sampling_correction
    if importance_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_ratio
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    try:
        return trainer._compute_loss(trainer.model, inputs)
    finally:
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = saved
