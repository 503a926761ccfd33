"""What this machine's processor is and which instruction sets it has: read once, in one place.

Everything that keys a measurement or a compiled kernel by the processor (the dtype choice, the native
kernels' build, the benchmarks' headers) asks `cpu_features()`.

`VRIKSHA_CPU_AS=<level>` (`generic`, `avx2`, `avx512`, `avx512_bf16`) hides the flags above that level, so
that this process chooses its kernels, dtype and arithmetic as a narrower CPU would and skips the tests such
a CPU skips; with `ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA` and `MKL_ENABLE_INSTRUCTIONS` (torch's, oneDNN's
and MKL's own caps, `make test-as-avx2`) a wider machine runs the suite as an AVX2-only one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from vriksha.errors import ConfigError

# the flags that decide which arithmetic is fast here, in the order they are reported
NOTABLE = (
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "sve",
    "bf16",
    "i8mm",
)

# what each `VRIKSHA_CPU_AS` level hides: every flag starting with one of these
LEVELS: dict[str, tuple[str, ...]] = {
    "generic": ("avx", "fma", "f16c", "amx"),
    "avx2": ("avx512", "avx_vnni", "avx_ifma", "avx_ne_convert", "amx"),  # x86-64-v4 and later
    "avx512": ("avx512_bf16", "avx512_fp16", "amx"),
    "avx512_bf16": ("avx512_fp16", "amx"),
}


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    model: str
    flags: frozenset[str]
    torch_capability: str  # the widest vector ISA torch's own kernels dispatch to here

    def has(self, *names: str) -> bool:
        return all(n in self.flags for n in names)

    @property
    def notable(self) -> tuple[str, ...]:
        return tuple(f for f in NOTABLE if f in self.flags)

    @property
    def signature(self) -> str:
        """A short digest of the model name and the full flag set (a cache key)."""
        text = self.model + "|" + " ".join(sorted(self.flags)) + "|" + platform.machine()
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def summary(self) -> str:
        flags = " ".join(self.notable) or "no vector extensions named"
        return f"{self.model} [{flags}] (torch kernels: {self.torch_capability})"

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "flags": list(self.notable), "torch_capability": self.torch_capability}


def hidden_above(level: str, flags: frozenset[str]) -> frozenset[str]:
    """`flags` as a CPU of `level` would list them (the ones it shares with this CPU)."""
    if level not in LEVELS:
        raise ConfigError(f"VRIKSHA_CPU_AS={level!r} is not a level; the levels are {', '.join(LEVELS)}")
    return frozenset(f for f in flags if not f.startswith(LEVELS[level]))


def _read_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if not model and key in ("model name", "hardware", "cpu model"):
            model = value.strip()
        elif not flags and key in ("flags", "features"):
            flags = frozenset(value.split())
    return model, flags


@functools.cache
def cpu_features() -> CpuFeatures:
    """The processor this process runs on (Linux /proc/cpuinfo; elsewhere the platform's name only)."""
    try:
        model, flags = _read_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        model, flags = "", frozenset()
    level = os.environ.get("VRIKSHA_CPU_AS")
    if level:
        flags = hidden_above(level, flags)
        model = f"{model or platform.processor() or platform.machine()} as {level}"
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = "unknown"
    return CpuFeatures(model or platform.processor() or platform.machine(), flags, capability)
