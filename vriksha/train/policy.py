"""Build the policy (and its tokenizer) from the model section of the config."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from vriksha.errors import ConfigError
from vriksha.train.config import ModelConfig, TrainConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

__all__ = ["load_policy"]


def load_run_policy(cfg: TrainConfig, is_main: bool, out_dir: Path) -> tuple[PreTrainedModel, Any]:
    """The run's start on every rank: the main rank writes `config.json` and converts a GGUF once (before
    the other ranks look), then each rank loads the policy and its tokenizer."""
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    if is_main and cfg.model.random_init is None:
        from vriksha.loading import resolve_model_path

        resolve_model_path(cfg.model.path)
    dist.barrier()
    return load_policy(cfg.model, cfg.trainer.seed)


def load_policy(cfg: ModelConfig, seed: int) -> tuple[PreTrainedModel, Any]:
    """The policy and its tokenizer. Every rank builds identical weights (same seed)."""
    from transformers import PreTrainedModel

    from vriksha.loading import load_model, load_tokenizer, resolve_model_path

    dtype = getattr(torch, cfg.dtype)
    if cfg.random_init is None:
        loaded = load_model(cfg.path, dtype=dtype)
        model = loaded.model
        if not isinstance(model, PreTrainedModel):
            raise ConfigError(
                f"model.path: {cfg.path} loads as {type(model).__name__}, not a Transformers causal LM"
            )
        tokenizer: Any = loaded.tokenizer
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        tokenizer = load_tokenizer(resolve_model_path(cfg.path))
        values = dict(cfg.random_init)
        model_type = values.pop("model_type", "llama")
        values.setdefault("vocab_size", len(tokenizer))
        for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
            tok_id = getattr(tokenizer, key, None)
            if tok_id is not None:
                values.setdefault(key, tok_id)
        try:
            config = AutoConfig.for_model(model_type, **values)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model.random_init: {exc}") from None
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # eval mode: no dropout, so the trainer's log-probs are the engine's sampling distribution
    # (autograd does not care about the mode)
    model.eval()
    return model, tokenizer


def decoder_layers(model: torch.nn.Module, option: str, purpose: str, remedy: str) -> torch.nn.ModuleList:
    """The `model.layers` list of a Llama-style decoder; a ConfigError naming `option` and its `remedy` where the
    model has none."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(
            f"{option}: {type(model).__name__} has no `model.layers` list of decoder layers{purpose}; {remedy}"
        )
    return layers
