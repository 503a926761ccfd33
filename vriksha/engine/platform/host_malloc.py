"""Freed host memory kept mapped for the next step: glibc malloc's two thresholds, set once per process.

glibc serves a block of 128 KiB or more with fresh pages from `mmap` (the threshold rises only after such a
block is freed, and only up to the size freed) and hands the free top of its heap back to the kernel above
128 KiB. An engine step on the CPU allocates activations of a few MiB per layer (a 1,024-token prefill
chunk's MLP rows: 6 MiB each), so a step keeps faulting in and zeroing pages it freed a moment ago; in a
virtual machine each of those faults can also cost an exit to the hypervisor, which no profile inside it
shows. Raising the mmap threshold to its ceiling (32 MiB on 64-bit) and the trim threshold to 1 GiB keeps
those pages mapped and reused. Larger blocks (the KV pool, the weights) are still mapped on their own.

Left alone: other C libraries, a process whose environment already sets glibc's malloc settings
(`MALLOC_*_`, `GLIBC_TUNABLES`), and one with tcmalloc, jemalloc or mimalloc preloaded (they manage their
own pages).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: glibc refuses more
TRIM_THRESHOLD = 1 << 30
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
OTHER_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")


@dataclass(frozen=True, slots=True)
class MallocChoice:
    """What was done to the process's allocator and why (logs, `generate --verbose`)."""

    tuned: bool
    reason: str

    def describe(self) -> str:
        return f"host malloc {'kept mapped' if self.tuned else 'as it was'}: {self.reason}"


_choice: MallocChoice | None = None  # process-wide, like the setting


def keep_freed_memory(enabled: bool = True) -> MallocChoice:
    """Raise glibc's mmap and trim thresholds once per process where nothing says otherwise (see the module)."""
    global _choice
    if not enabled:
        earlier = (
            " (an earlier engine in this process already raised them)" if _choice and _choice.tuned else ""
        )
        return MallocChoice(False, f"off (--no-host-malloc-tuning){earlier}")
    if _choice is not None:
        return _choice
    _choice = _tune()
    logger.info(_choice.describe())
    return _choice


def _tune() -> MallocChoice:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return MallocChoice(False, "not glibc")
    given = [name for name in USER_SETTINGS if name in os.environ]
    if given:
        return MallocChoice(False, f"the environment sets {', '.join(given)}")
    preload = os.environ.get("LD_PRELOAD", "")
    other = next((name for name in OTHER_ALLOCATORS if name in preload), None)
    if other:
        return MallocChoice(False, f"{other} is preloaded")
    libc = ctypes.CDLL(None)
    if not (
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return MallocChoice(False, "glibc refused the thresholds")
    return MallocChoice(
        True,
        f"blocks under {MMAP_THRESHOLD >> 20} MiB from the heap, up to {TRIM_THRESHOLD >> 30} GiB of it kept "
        "(glibc's mmap and trim thresholds)",
    )


def return_freed_memory() -> bool:
    """Hand glibc's free heap pages back to the kernel now (`malloc_trim(0)`), whatever the trim threshold:
    after a large free that is meant to leave the process (the KV pool released for a training update).
    False where the C library is not glibc."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    ctypes.CDLL(None).malloc_trim(0)
    return True
