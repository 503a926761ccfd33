"""The one place where the engine's layers are bound to kernels: kernel sets, chosen per device and dtype.

A kernel set supplies the operations the engine's forward runs outside Transformers' modules: RMSNorm (with
the residual add fused), SiLU gating, rotary embedding, decode attention over the KV pool in place, and a
linear kernel that `DenseLinear` measures against torch's paths. `TorchKernels` is torch's ops (every device
and dtype); `NativeKernels` the engine's C kernels (CPU, float32 and bfloat16), one set per
instruction-set variant; `triton` the Triton kernels (platform/triton_kernels.py) on the devices Triton compiles
for, when triton is installed. `select(name, device, dtype)` resolves `--kernels auto|torch|native|<name>`;
`available(device, dtype)` lists the sets that run there, best first.

Adding a set: subclass `TorchKernels`, override the operations it speeds up, and `register()` it with a
priority and the devices and dtypes it supports (docs/kernels.md).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import vriksha.device as devices
from vriksha.engine.platform import native
from vriksha.engine.platform.native import isa
from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)


class TorchKernels:
    """torch's ops, with the math and rounding of the Transformers modules they stand for."""

    name = "torch"

    def rms_norm(
        self, x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """RMSNorm of x [..., dim] by `norm`'s weight and epsilon; with `residual`, x += residual first, in place."""
        if residual is not None:
            x.add_(residual)
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
        h = x.float()  # Transformers normalises in float32 and scales by the weight after casting back
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * h.to(x.dtype)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (rotate-half form) of x [tokens, heads, dim] by cos, sin [tokens, dim]."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None] + rotated * sin[:, None]

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def decode_attention_for(self, dtype: torch.dtype) -> Callable | None:
        """A kernel attending one query per request over the pool in place (native signature), or None:
        the attention function then gathers K/V and runs SDPA."""
        return None

    def prefill_attention_for(self, dtype: torch.dtype) -> Callable | None:
        """A kernel attending a prompt chunk's queries over the pool in place, causally (native signature:
        `(q [T, H, D] float32, k_pool, v_pool, slots, scale) -> out [T, H, Dv] float32 or None`), or None: the
        attention function then gathers K/V and runs SDPA."""
        return None

    def linear_for(self, dtype: torch.dtype) -> native.Kernels | None:
        """An object whose `linear(x, weight, bias)` DenseLinear may time against torch's paths, or None."""
        return None

    def describe(self) -> str:
        return self.name


class NativeKernels(TorchKernels):
    """The engine's C kernels (native/), one instruction-set variant, float32 and bfloat16 on the CPU."""

    def __init__(self, lib: native.Kernels, name: str) -> None:
        self.lib = lib
        self.name = name

    def rms_norm(
        self, x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.dtype not in native.DTYPES or norm.weight.dtype != x.dtype or not x.is_contiguous():
            return super().rms_norm(x, norm, residual)
        return self.lib.rms_norm(x, norm.weight, norm.variance_epsilon, residual=residual)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dtype not in native.DTYPES or cos.dtype != x.dtype or not x.is_contiguous():
            return super().rope(x, cos, sin)
        return self.lib.rope_(x, cos, sin)  # in place

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.dtype not in native.DTYPES or up.dtype != gate.dtype:
            return super().silu_mul(gate, up)
        return self.lib.silu_mul(gate.contiguous(), up.contiguous())

    def decode_attention_for(self, dtype: torch.dtype) -> Callable | None:
        return self.lib.decode_attention if dtype in native.DTYPES else None

    def prefill_attention_for(self, dtype: torch.dtype) -> Callable | None:
        # bf16: only the AVX-512 BF16 build has the kernel. float32: every AVX2 build has it, offered where it
        # was measured against SDPA (1.5-2x a layer on an AVX2-only EPYC); AVX-512 builds keep SDPA
        if dtype == torch.bfloat16:
            return self.lib.prefill_attention if "avx512_bf16" in self.lib.variant.cpu_flags else None
        if dtype == torch.float32:
            return self.lib.prefill_attention if self.lib.variant.name == "avx2" else None
        return None

    def linear_for(self, dtype: torch.dtype) -> native.Kernels | None:
        return self.lib if dtype in native.DTYPES else None

    def describe(self) -> str:
        return f"{self.name} ({self.lib.variant.name}: {self.lib.path.name})"


@dataclass(frozen=True, slots=True)
class KernelSetSpec:
    name: str
    priority: int  # `auto` takes the highest that supports the device and dtype
    supports: Callable[[torch.device, torch.dtype], bool]
    build: Callable[[], TorchKernels | None]  # None: cannot run here after all (no compiler, ...)
    native: bool = False  # the engine option `native_kernels=False` leaves these out
    automatic: Callable[[torch.device, torch.dtype], bool] | None = None  # where `auto` may take it (None:
    # wherever it runs); a set it leaves out is still chosen by name


_REGISTRY: dict[str, KernelSetSpec] = {}


def register(spec: KernelSetSpec) -> None:
    """Add (or replace) a kernel set by name."""
    _REGISTRY[spec.name] = spec


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _native_set(variant: str | None, name: str) -> Callable[[], TorchKernels | None]:
    def build() -> TorchKernels | None:
        lib = native.kernels(variant)
        return NativeKernels(lib, name) if lib is not None else None

    return build


def _host_native(device: torch.device, dtype: torch.dtype) -> bool:
    return devices.is_host(device) and dtype in native.DTYPES


register(KernelSetSpec("torch", 0, lambda device, dtype: True, TorchKernels))
register(KernelSetSpec("native", 100, _host_native, _native_set(None, "native"), native=True))
for _variant in isa.VARIANTS:
    register(
        KernelSetSpec(
            f"native-{_variant.name}",
            10,  # reached by name; `auto` takes `native`, the widest variant this CPU runs
            lambda device, dtype, v=_variant: _host_native(device, dtype) and isa.runnable(v),
            _native_set(_variant.name, f"native-{_variant.name}"),
            native=True,
        )
    )


def _triton_interpreted() -> bool:
    """Triton's interpreter is on (`TRITON_INTERPRET=1`, read when triton is imported): its kernels run on
    CPU tensors, slowly; for tests, so `auto` never takes it."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _triton_device_types() -> frozenset[str]:
    """The device types Triton compiles for here (none where triton is not installed)."""
    if importlib.util.find_spec("triton") is None:
        return frozenset()
    try:
        from triton.backends import backends
    except Exception as exc:  # a broken install must not take the engine down: the set is just not offered
        logger.info("triton is installed but its backends do not load (%s); no triton kernel set", exc)
        return frozenset()
    return frozenset(devices.triton_device_types(list(backends)))


def _triton_supports(device: torch.device, dtype: torch.dtype) -> bool:
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if devices.is_host(device):
        return _triton_interpreted() and importlib.util.find_spec("triton") is not None
    return device.type in _triton_device_types()


def _build_triton() -> TorchKernels | None:
    try:
        from vriksha.engine.platform.triton_kernels import TritonKernels
    except Exception as exc:
        logger.warning("the triton kernel set does not load (%s); keeping the next set", exc)
        return None
    return TritonKernels()


register(
    KernelSetSpec(
        "triton",
        200,  # above `native`, which never runs where Triton compiles
        _triton_supports,
        _build_triton,
        automatic=lambda device, dtype: not devices.is_host(device),
    )
)


def names() -> list[str]:
    return sorted(_REGISTRY, key=lambda n: -_REGISTRY[n].priority)


def available(device: torch.device | str, dtype: torch.dtype, include_native: bool = True) -> list[str]:
    """The kernel sets that support (device, dtype), best first (`auto` takes the first that builds)."""
    device = torch.device(device)
    return [
        n
        for n in names()
        if _REGISTRY[n].supports(device, dtype) and (include_native or not _REGISTRY[n].native)
    ]


def select(
    name: str, device: torch.device | str, dtype: torch.dtype, include_native: bool = True
) -> TorchKernels:
    """The kernel set `name` ("auto": the best available that builds) for layers on `device` in `dtype`."""
    device = torch.device(device)
    candidates = available(device, dtype, include_native)
    if name == "auto":
        for candidate in candidates:
            automatic = _REGISTRY[candidate].automatic
            if automatic is not None and not automatic(device, dtype):
                continue
            built = _REGISTRY[candidate].build()
            if built is not None:
                return built
        return TorchKernels()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown kernel set {name!r}; the kernel sets are auto, {', '.join(names())}")
    if _REGISTRY[name].native and not include_native:
        raise ConfigError(f"kernel set {name!r} is native, but native kernels are off (--no-native-kernels)")
    if name not in candidates:
        raise ConfigError(
            f"kernel set {name!r} does not run {dtype} on {device}; here these do: {', '.join(candidates)}"
        )
    built = _REGISTRY[name].build()
    if built is None:
        raise ConfigError(f"kernel set {name!r} could not be loaded here (see the log); use --kernels torch")
    return built
