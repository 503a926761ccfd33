"""The engine's `quantization` option: which linear weights are served packed, decided once at load.

- `none`: the dense weights (the engine's dtype, fp32 or bf16).
- `gguf`: the GGUF file's own Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K blocks (the embedded model
  or `--model FILE.gguf`).
- `int8`: weight-only int8 with one scale per output channel, quantized at load from any model's weights.
- `auto` (the default): the GGUF blocks where the model came from a GGUF file and the packed layers of one
  decode step (one row) were measured faster than their dense path on this CPU, else `none`. The timings are
  cached per CPU, dtype, thread count and kernel build (`platform/packed_linear.py`), so the choice is measured, not
  assumed.

Packed kernels run on the CPU with fp32 or bf16 activations (bf16 ones are widened to fp32 in registers, the
sums are fp32); `auto` falls back to `none` elsewhere, an explicit `gguf` or `int8` there is a configuration
error.

The dtype follows from the weights served (`packed_dtype`): under `dtype="fastest"`, a GGUF model whose every
linear layer the packed kernels serve runs float32 when a packed decode step (one row, measured on the file's
shapes before loading) beats the dense decode step of every dtype `compute_dtype` timed. Decode then reads the
4-bit blocks whatever the dtype, and float32 is the dtype whose decode steps run as one native call
(`runner/native_decode.py`); bf16 would keep only its edge on large prefill matmuls. Under `dtype="auto"` the engine
runs float32 anyway (the model's own numbers).

What the packed kernels do with activations (`packed_activations`, `packed_activations()`): `float32`, the
default, multiplies the dequantized weights with the activations as they are, so a packed layer computes the
dequantized model's numbers (to fp32 summation order) at every batch size, on the packed path or the dense
one; `int16` rounds each block of 32 activations to 1/65534 of its largest (logits within about 1e-3 of the
dequantized model's); `int8` (llama.cpp's Q8 numerics, up to 1.9x faster linears on AVX2) moves logits about
as far as a bf16 model's, and is what `auto` allows where the engine already runs at a bf16 engine's
precision: `dtype="fastest"` with fp32 matmuls allowed bf16 arithmetic, the same rule as `fp32_precision`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

import vriksha.device as devices
from vriksha.engine.config import PACKED_ACTIVATIONS
from vriksha.engine.platform import fp32_precision
from vriksha.engine.platform.compute_dtype import DtypeChoice
from vriksha.engine.platform.module_installation import ModuleInstallation
from vriksha.engine.platform.native import Kernels
from vriksha.engine.platform.native.quant import QuantKernels, quant_kernels
from vriksha.engine.platform.packed_linear import PackedLinear, PackedShape, PackedTimings
from vriksha.errors import ConfigError

if TYPE_CHECKING:
    from vriksha.engine.config import EngineConfig
from vriksha.loading.packed import quantize_int8

logger = logging.getLogger(__name__)

MODES = ("none", "gguf", "int8", "auto")
SHORT_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(slots=True)
class QuantizationChoice:
    """What the engine serves and why; `describe()` is what the log and `generate --verbose` show."""

    requested: str
    mode: str  # none | gguf | int8
    reason: str
    formats: dict[str, int] = field(default_factory=dict)
    variant: str | None = None
    packed_ms: float | None = None  # the packed layers of one decode step (1 row), measured
    dense_ms: float | None = None  # the same layers on their dense path (the engine's dtype)
    dense: str = "fp32"
    activations: str = (
        "float32"  # what the packed kernels do with activations: float32, int16, or int8 somewhere
    )

    def describe(self) -> str:
        text = f"quantization {self.mode} (requested {self.requested}): {self.reason}"
        if self.formats:
            text += f"; packed layers {', '.join(f'{n} {q}' for q, n in sorted(self.formats.items()))}"
        if self.variant:
            text += f"; packed paths {self.variant}, {self.activations} activations"
        if self.packed_ms is not None and self.dense_ms is not None:
            text += (
                f"; decode-step linears {self.packed_ms:.2f} ms packed vs {self.dense_ms:.2f} ms {self.dense}"
            )
        return text


def packed_activations(requested: str, fp32_precision_requested: str, dtype_measured: bool) -> str:
    """The least precise activations the packed kernels may use: `float32` (the activations as they are: the
    dequantized model's numbers), `int16` (each block of 32 rounded to 1/65534 of its largest) or `int8`
    (1/254, llama.cpp's Q8 numerics). `requested` is the engine's `packed_activations`; `auto` is float32,
    except where the engine already runs at a bf16 engine's precision (`--dtype fastest`, or fp32_precision
    bf16: see the module's text), where int8 is timed beside the float paths and taken where faster."""
    if requested not in PACKED_ACTIVATIONS:
        raise ConfigError(
            f"engine option packed_activations must be one of {', '.join(PACKED_ACTIVATIONS)}, got {requested!r}"
        )
    if requested != "auto":
        return requested
    allowed = fp32_precision.bf16_precision_allowed(fp32_precision_requested, dtype_measured)
    return "int8" if allowed else "float32"


def packed_dtype(dense: DtypeChoice, config: EngineConfig, device: torch.device) -> DtypeChoice | None:
    """float32 in place of `dense` (the measured dense choice of `dtype="fastest"`) where the model's GGUF blocks
    make decode faster than any dense dtype (see the module's text), else None."""
    from vriksha.engine.platform import kernel_sets
    from vriksha.loading.gguf_weights import gguf_linear_types
    from vriksha.loading.loader import gguf_source

    if dense.how not in ("measured", "cached") or config.quantization not in ("auto", "gguf"):
        return None
    gguf = gguf_source(config.model) if devices.is_host(device) and dense.timings else None
    kernels = quant_kernels() if gguf is not None else None
    if kernels is None:
        return None
    types = gguf_linear_types(gguf)
    if not types or any(qtype is None for qtype, _, _ in types):
        return None  # some layers would stay dense: the dense choice stands
    kernel_set = kernel_sets.select(
        config.platform.kernels, device, torch.float32, config.platform.native_kernels
    )
    fp32_kernels = kernel_set.linear_for(torch.float32)
    bf16 = config.platform.fast_linear and fp32_precision.resolve(
        config.platform.fp32_precision, torch.float32, True, True
    )
    activations = packed_activations(
        config.platform.packed_activations, config.platform.fp32_precision, dtype_measured=True
    )
    timings = PackedTimings(
        kernels, fp32_kernels, torch.float32, bf16, activations
    )  # the packed paths' timing key
    packed_s, _ = timings.step_seconds([PackedShape(*t) for t in types], rows=1)
    best = min(dense.timings, key=lambda name: dense.timings[name]["decode_s"])
    best_s = dense.timings[best]["decode_s"]
    if packed_s >= best_s:
        return None
    return DtypeChoice(
        torch.float32,
        dense.requested,
        f"{dense.how}: decode from the GGUF's packed blocks, {packed_s * 1e3:.2f} ms a step against "
        f"{best_s * 1e3:.2f} ms for dense {SHORT_DTYPES[getattr(torch, best)]}; float32 runs it natively",
        dense.device,
        timings=dense.timings,
    )


def _packed_weights(model: nn.Module, mode: str, gguf: Path | None) -> dict:
    if mode == "int8":
        return {
            name: quantize_int8(m.weight)
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and m.weight.dtype in QuantKernels.DTYPES
        }
    from vriksha.loading.gguf_weights import read_gguf_linears

    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    return read_gguf_linears(gguf, tie_word_embeddings=tied)


def apply(
    model: nn.Module,
    requested: str,
    installation: ModuleInstallation,
    dense_kernels: Kernels | None,
    gguf: Path | None,
    cpu: bool,
    bf16: bool = False,
    activations: str = "float32",
) -> tuple[PackedLinear | None, QuantizationChoice]:
    """Decide what to serve for `requested` and install it; returns the packed linear layers (None for dense) and why.
    `dense_kernels`: the native linear kernels of the model's dtype, the dense path packed layers are timed
    against; `cpu`: whether the model runs on the host; `bf16`: the dense path of an fp32 model may run in
    bf16 arithmetic (`platform/fp32_precision.py`); `activations`: the least precise activations the packed kernels may
    use (`packed_activations`)."""
    if requested not in MODES:
        raise ConfigError(f"engine option quantization must be one of {', '.join(MODES)}, got {requested!r}")
    dtype = next(model.parameters()).dtype
    dense = SHORT_DTYPES.get(dtype, str(dtype).removeprefix("torch."))
    if requested == "none":
        return None, QuantizationChoice(requested, "none", f"{dense} weights as requested", dense=dense)
    explicit = requested != "auto"
    mode = "gguf" if requested == "auto" else requested

    def refuse(why: str, fix: str) -> tuple[None, QuantizationChoice]:
        if explicit:
            raise ConfigError(f"quantization {requested}: {why}; {fix}")
        return None, QuantizationChoice(requested, "none", why, dense=dense)

    if not cpu or dtype not in QuantKernels.DTYPES:
        return refuse(
            f"packed kernels run on the CPU with float32 or bfloat16 activations, not {dense} on "
            f"{'the CPU' if cpu else 'an accelerator'}",
            "use --dtype float32 or --dtype bfloat16 on the CPU",
        )
    if mode == "gguf" and gguf is None:
        return refuse(
            "the model was not loaded from a GGUF file",
            "pass the embedded default or --model FILE.gguf, or use --quantization int8",
        )
    kernels = quant_kernels()
    if kernels is None:
        return refuse("the quantized kernels could not be built (no C compiler?)", "install gcc or clang")
    packed = _packed_weights(model, mode, gguf)
    if not packed:
        return refuse("no linear weight in a packed format", "use --quantization none")
    packed_linear = PackedLinear(model, packed, kernels, dense_kernels, bf16, activations)
    choice = QuantizationChoice(
        requested, mode, "as requested", packed_linear.formats(), kernels.variant, dense=dense
    )
    if explicit:
        packed_linear.install(installation)
        choice.activations, choice.variant = packed_linear.activations(), _paths(packed_linear)
        return packed_linear, choice
    packed_s, dense_s = packed_linear.step_seconds(1)
    choice.packed_ms, choice.dense_ms = packed_s * 1e3, dense_s * 1e3
    if packed_s >= dense_s:
        choice.mode, choice.formats, choice.variant = "none", {}, None
        choice.reason = f"the GGUF's packed weights measured slower than {dense} on this CPU"
        return None, choice
    choice.reason = f"the GGUF's packed weights measured faster than {dense}"
    packed_linear.install(installation, measured=True)
    choice.activations, choice.variant = packed_linear.activations(), _paths(packed_linear)
    return packed_linear, choice


def _paths(packed_linear: PackedLinear) -> str:
    return ", ".join(sorted(packed_linear.paths())) or "none (the dense path measured faster everywhere)"
