"""Instruction-set variants of the native kernels, and the one this CPU can run best.

Each variant compiles the same sources with explicit instruction-set flags (never `-march=native`, so a
variant builds, and can be compile-tested, on a machine that cannot run it); `best_variant()` picks the
widest one whose CPU flags /proc/cpuinfo lists. `VRIKSHA_NATIVE_ISA=<name>` forces a variant.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from vriksha.engine.platform.cpu_features import cpu_features
from vriksha.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    cpu_flags: frozenset[str]  # as /proc/cpuinfo spells them
    cflags: tuple[str, ...]


_AVX2 = ("-mavx2", "-mfma")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")

# widest first; the scalar build runs anywhere
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "avx512_bf16",
        frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}),
        (*_AVX512, "-mavx512bf16"),
    ),
    Variant("avx512", frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}), _AVX512),
    Variant("avx2", frozenset({"avx2", "fma"}), _AVX2),
    Variant("generic", frozenset(), ()),
)
BY_NAME = {v.name: v for v in VARIANTS}


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where they cannot be read), as `vriksha.engine.platform.cpu_features` reads them."""
    return cpu_features().flags


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def runnable(variant: Variant) -> bool:
    """Whether this CPU has every flag the variant is compiled for."""
    if variant.cflags and not is_x86():
        return False
    return variant.cpu_flags <= cpu_flags()


def missing_flags(variant: Variant) -> list[str]:
    return sorted(variant.cpu_flags - cpu_flags())


def variant(name: str) -> Variant:
    if name not in BY_NAME:
        raise ConfigError(f"unknown native kernel variant {name!r}; the variants are {', '.join(BY_NAME)}")
    return BY_NAME[name]


def best_variant() -> Variant:
    """The widest variant this CPU runs, or the one `VRIKSHA_NATIVE_ISA` names."""
    forced = os.environ.get("VRIKSHA_NATIVE_ISA")
    if forced:
        chosen = variant(forced)
        if not runnable(chosen):
            raise ConfigError(
                f"VRIKSHA_NATIVE_ISA={forced} needs CPU flags {', '.join(missing_flags(chosen))} this CPU lacks"
            )
        return chosen
    return next(v for v in VARIANTS if runnable(v))
