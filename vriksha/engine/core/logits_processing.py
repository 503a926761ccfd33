"""What a request asks of the logits before sampling, batched on the logits' device: allowed tokens, bad
words, logit bias, repetition / presence / frequency penalties, and grammar token masks.

Order as in vLLM: token restrictions and bias first, then the penalties, then the grammar's mask (which
only removes tokens, so it never lets a banned token back in).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from vriksha.device import is_host
from vriksha.engine.core.request import Request

NEG_INF = float("-inf")


class MaskKernel(Protocol):
    """A kernel that applies llguidance's packed masks to logits in place (the platform's native one,
    `platform/native/bitmask.py`, chosen at load)."""

    def accepts(self, logits: torch.Tensor) -> bool: ...

    def apply_(self, logits: torch.Tensor, rows: list[int] | None, bitmask: torch.Tensor) -> None: ...


def _padded(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, L] token ids padded with 0, and the mask of real entries."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    real = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
            real[i, : len(r)] = True
    return ids.to(device), real.to(device)


def _counts(rows: list[list[int]], vocab: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    ids, real = _padded(rows, device)
    counts = torch.zeros(len(rows), vocab, dtype=dtype, device=device)
    return counts.scatter_add_(1, ids, real.to(dtype))


def apply_restrictions(logits: torch.Tensor, requests: list[Request]) -> None:
    """allowed_token_ids, bad_words and logit_bias, in place."""
    device, vocab = logits.device, logits.shape[-1]
    allowed = [(i, r.params.allowed_token_ids) for i, r in enumerate(requests) if r.params.allowed_token_ids]
    if allowed:
        keep = torch.zeros(len(allowed), vocab, dtype=torch.bool)
        for j, (_, ids) in enumerate(allowed):
            keep[j, ids] = True
        rows = torch.tensor([i for i, _ in allowed], device=device)
        logits[rows] = logits[rows].masked_fill(~keep.to(device), NEG_INF)
    ban_rows: list[int] = []
    ban_cols: list[int] = []
    for i, r in enumerate(requests):
        for word in r.bad_word_ids:
            prefix = word[:-1]
            if not prefix or r.output_token_ids[-len(prefix) :] == prefix:
                ban_rows.append(i)
                ban_cols.append(word[-1])
    if ban_rows:
        logits[torch.tensor(ban_rows, device=device), torch.tensor(ban_cols, device=device)] = NEG_INF
    bias_rows: list[int] = []
    bias_cols: list[int] = []
    bias_vals: list[float] = []
    for i, r in enumerate(requests):
        for token, value in (r.params.logit_bias or {}).items():
            bias_rows.append(i)
            bias_cols.append(token)
            bias_vals.append(value)
    if bias_rows:
        index = (torch.tensor(bias_rows, device=device), torch.tensor(bias_cols, device=device))
        logits.index_put_(index, torch.tensor(bias_vals, dtype=logits.dtype, device=device), accumulate=True)


def apply_penalties(logits: torch.Tensor, requests: list[Request]) -> None:
    """Repetition (prompt + output), presence and frequency (output only) penalties, in place."""
    which = [i for i, r in enumerate(requests) if r.params.penalized]
    if not which:
        return
    device, vocab, dtype = logits.device, logits.shape[-1], logits.dtype
    sub = [requests[i] for i in which]
    rows = torch.tensor(which, device=device)
    x = logits[rows]
    out_counts = _counts([r.output_token_ids for r in sub], vocab, device, dtype)
    rep = torch.tensor([r.params.repetition_penalty for r in sub], dtype=dtype, device=device)[:, None]
    if bool((rep != 1.0).any()):
        seen = _counts([r.prompt_token_ids for r in sub], vocab, device, dtype) + out_counts > 0
        penalised = torch.where(x > 0, x / rep, x * rep)
        x = torch.where(seen, penalised, x)
    freq = torch.tensor([r.params.frequency_penalty for r in sub], dtype=dtype, device=device)[:, None]
    pres = torch.tensor([r.params.presence_penalty for r in sub], dtype=dtype, device=device)[:, None]
    x = x - freq * out_counts - pres * (out_counts > 0).to(dtype)
    logits[rows] = x


def bitmask_in_place(logits: torch.Tensor, kernel: MaskKernel | None) -> bool:
    """Whether `apply_bitmask` writes these logits in place through `kernel` (fp32 rows on the CPU): then they
    may be an inference tensor, and the caller need not copy them first."""
    return kernel is not None and kernel.accepts(logits)


def apply_bitmask(
    logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor, kernel: MaskKernel | None = None
) -> None:
    """Keep only tokens whose bit is set: `bitmask` is int32 [len(rows), ceil(vocab / 32)] (llguidance's).

    With `kernel` (the native one, `native/bitmask.c`, on the CPU) the packed words are read and -inf written
    into the blocked logits in place, skipping words that allow all 32 tokens. Elsewhere (or without a C
    compiler) the words are unpacked on the host as little-endian bits, one byte per token, and the logits
    filled in place."""
    if not rows:
        return
    if bitmask_in_place(logits, kernel) and is_host(bitmask.device):
        every = rows == list(range(len(rows)))
        kernel.apply_(logits, None if every else rows, bitmask)
        return
    apply_bitmask_unpacked(logits, rows, bitmask)


def apply_bitmask_unpacked(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """`apply_bitmask` by unpacking the words with numpy (the reference the native kernel is tested against)."""
    vocab = logits.shape[-1]
    words = np.invert(bitmask.contiguous().cpu().numpy().view(np.uint8))  # set bits = blocked tokens
    bits = np.unpackbits(words, axis=1, bitorder="little", count=min(vocab, words.shape[1] * 8))
    blocked = torch.from_numpy(bits).view(torch.bool).to(logits.device)
    if blocked.shape[1] < vocab:  # tokens past the mask's words are never allowed
        blocked = torch.nn.functional.pad(blocked, (0, vocab - blocked.shape[1]), value=True)
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(blocked, NEG_INF)
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(blocked, NEG_INF)
