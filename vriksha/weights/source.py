"""The trainer's side of the tensors: full (unsharded) parameters, gathered once and cast once per update."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from vriksha.weights.plan import TensorSpec


def full_parameters(
    module: nn.Module, dtypes: dict[str, torch.dtype] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) per parameter: an FSDP2/TP DTensor is gathered with one `full_tensor()` (a
    collective: every rank must iterate), then cast once to the receiver's dtype where it differs."""
    from torch.distributed.tensor import DTensor

    for name, p in module.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        want = (dtypes or {}).get(name)
        if want is not None and t.dtype != want:
            t = t.to(want)
        yield name, t


def specs_of(tensors: list[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [TensorSpec.of(n, t) for n, t in tensors]
