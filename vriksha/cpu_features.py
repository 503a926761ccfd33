"""What this machine's processor is and which instruction sets it has: read once, in one place.

Everything that keys a measurement or a compiled kernel by the processor (the dtype choice, the native
kernels' build, the benchmarks' headers) asks `cpu_features()`.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

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
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = "unknown"
    return CpuFeatures(model or platform.processor() or platform.machine(), flags, capability)
