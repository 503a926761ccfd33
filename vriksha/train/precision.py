"""The dtype the policy update computes in: fp32, bf16 autocast over fp32 master weights, or FSDP2's bf16.

`model.mixed_precision = "auto"` (the default) asks the same measurement the engine's `dtype="fastest"` makes
(`vriksha/fast_dtype.py`, cached per machine): where this CPU (or device) runs the policy's linear shapes
faster in bf16, the training forwards and backwards run under bf16 autocast while the parameters, gradients
and optimizer state stay fp32; where it does not (an AVX2-only CPU), everything stays fp32. "none" and
"autocast" force either; "bfloat16" casts the parameters for compute through FSDP2's mixed precision.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from vriksha import fast_dtype

logger = logging.getLogger(__name__)

__all__ = ["TrainPrecision", "resolve_precision"]


@dataclass(frozen=True, slots=True)
class TrainPrecision:
    mode: str  # "fp32", "bf16-autocast", "bf16-fsdp", or the parameters' own dtype where they are not fp32
    requested: str  # the config's model.mixed_precision
    how: str  # measured, cached, given, or why auto kept the parameters' dtype
    choice: fast_dtype.DtypeChoice | None = None

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.mode == "bf16-fsdp" else None

    @contextlib.contextmanager
    def autocast(self, device: torch.device) -> Iterator[None]:
        """Around a training forward: bf16 autocast in `bf16-autocast` mode, nothing otherwise."""
        if self.mode != "bf16-autocast":
            yield
            return
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            yield

    def describe(self) -> str:
        text = f"training precision {self.mode} (mixed_precision={self.requested}: {self.how})"
        return text + (f"; {self.choice.describe()}" if self.choice is not None else "")


def resolve_precision(requested: str, model: torch.nn.Module, device: torch.device) -> TrainPrecision:
    if requested == "none":
        return TrainPrecision("fp32", requested, "given")
    if requested == "autocast":
        return TrainPrecision("bf16-autocast", requested, "given")
    if requested == "bfloat16":
        return TrainPrecision("bf16-fsdp", requested, "given")
    pin = fast_dtype.pinned(device)
    if pin is not None:  # $VRIKSHA_DTYPE: bf16 (or fp16) pins autocast, float32 pins fp32
        return TrainPrecision(
            "fp32" if pin.dtype == torch.float32 else "bf16-autocast", requested, pin.how, pin
        )
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return TrainPrecision(
            names, requested, "auto computes in the parameters' own dtype unless they are fp32"
        )
    choice = fast_dtype.choose_dtype(fast_dtype.linear_shapes(model), device)
    timings = {k: v for k, v in (choice.timings or {}).items() if k in ("float32", "bfloat16")}
    bf16 = "bfloat16" in timings and fast_dtype.pick(timings) == "bfloat16"  # fp16 would need loss scaling
    return TrainPrecision("bf16-autocast" if bf16 else "fp32", requested, choice.how, choice)
