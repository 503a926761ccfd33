"""A tiny random Llama with the embedded model's tokenizer, shared by tests that need a model directory."""

from __future__ import annotations

from pathlib import Path

import torch


def embedded_tokenizer():
    from vriksha.loading import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(None))


def tiny_llama(tokenizer, seed: int = 0, family: str = "llama", **overrides):
    """Two layers, hidden 64, GQA (4 query heads over 2 KV heads), the tokenizer's vocabulary and special ids;
    `family`: another Transformers model type of the same shape (qwen2, ...)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.update(overrides)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **config))


def save_model_dir(model, tokenizer, out: Path) -> Path:
    """`save_pretrained` of both: a directory `--model` and `AutoModelForCausalLM` load."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
