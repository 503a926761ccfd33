"""Export the trained policy as a Transformers directory (`save_pretrained` + tokenizer).

The result loads with `AutoModelForCausalLM.from_pretrained(dir)` and `vriksha serve --model dir`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

__all__ = ["export_model"]


def export_model(
    policy: nn.Module, plain: PreTrainedModel, tokenizer: Any, out_dir: str | Path, rank: int
) -> Path | None:
    """Collective: gather the full weights to rank 0, load them into `plain` (an unsharded module
    of the same architecture) and save it. Returns the directory on rank 0, None elsewhere."""
    out = Path(out_dir)
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        with torch.no_grad():
            own = plain.state_dict()
            for name, value in full.items():
                if name in own and isinstance(value, torch.Tensor):
                    own[name].copy_(value.to(own[name].device, own[name].dtype))
        out.mkdir(parents=True, exist_ok=True)
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        gen = getattr(plain, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(out)
        logger.info("exported the policy to %s", out)
    if dist.is_initialized():
        dist.barrier()
    return out if rank == 0 else None
