"""A host tensor's pages given back to the kernel while the tensor stays allocated.

Allocating a tensor zeroed (`torch.zeros`) writes every page, so all of it is resident from the start. Private
anonymous memory (what malloc and the CPU allocator hand out) that is `madvise(MADV_DONTNEED)`'d is dropped
from the process and reads as zero at the next touch, when the kernel maps a fresh zero page. So a large
zeroed buffer that fills gradually (the KV pool) costs resident memory only where it was written, and giving
it back (the pool released for a training update) keeps its addresses and needs no re-zeroing.
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch

import vriksha.device as devices

__all__ = ["drop_pages"]

MADV_DONTNEED = 4
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
if _libc is not None:
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The tensor storage's bytes, [start, end)."""
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def drop_pages(t: torch.Tensor) -> None:
    """Zero a contiguous host tensor's whole storage, leaving only its first and last partial pages resident:
    its whole pages are dropped (read as zero when touched again), the partial ones zeroed in place."""
    if not devices.is_host(t.device) or not t.is_contiguous():
        raise ValueError(f"drop_pages takes a contiguous host tensor, not one on {t.device}")
    start, end = _span(t)
    inner_start = -(-start // PAGE) * PAGE
    inner_end = end // PAGE * PAGE
    if _libc is None or inner_end <= inner_start:
        t.untyped_storage().fill_(0)
        return
    if _libc.madvise(ctypes.c_void_p(inner_start), ctypes.c_size_t(inner_end - inner_start), MADV_DONTNEED):
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_DONTNEED) on a tensor's pages failed: {os.strerror(err)}")
    raw = t.untyped_storage()
    head, tail = inner_start - start, end - inner_end
    if head:
        torch.empty(0, dtype=torch.uint8).set_(raw, 0, (head,)).zero_()
    if tail:
        torch.empty(0, dtype=torch.uint8).set_(raw, raw.nbytes() - tail, (tail,)).zero_()
