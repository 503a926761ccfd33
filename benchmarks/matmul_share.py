"""The machine's matmul peak and the share of it a serving run reaches, for the engine benchmark's report.

The peak is the best of ten [2048 x 2048] x [2048 x 2048] matmuls in the dtype (oneDNN, AMX where the CPU has
it), or of smaller ones where ten of those would take more than a few seconds. A run's rate counts the
linear layers' multiply-adds only (2 flops each): every decoder-layer linear
once per token computed (the prompt tokens the prefix cache did not hold, plus the new tokens), the output
head once per new token; attention is left out, so the share is a lower bound of the arithmetic done.
"""

from __future__ import annotations

import time

import torch

SIZE = 2048
SMALLEST = 256


def matmul_peak(dtype: torch.dtype, reps: int = 10, budget_s: float = 3.0) -> tuple[float, int]:
    """(GFLOP/s, size) of the best of `reps` square matmuls in `dtype` on the CPU.

    The size is SIZE unless `reps` of them would take more than `budget_s`: then the largest power of two
    from SMALLEST up that fits (bf16 on a CPU without bf16 instructions runs a hundred times slower than
    fp32, and a [2048 x 2048] matmul takes most of a minute there).
    """
    size = SMALLEST
    seconds = _best_mm(size, dtype, 1)
    while size < SIZE and seconds * 8 * reps <= budget_s:
        size *= 2
        seconds = _best_mm(size, dtype, 1)
    return 2 * size**3 / min(seconds, _best_mm(size, dtype, reps - 1)) / 1e9, size


def _best_mm(size: int, dtype: torch.dtype, reps: int) -> float:
    """Seconds of the fastest of `reps` matmuls of one pair of [size x size] matrices, after a warm-up."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    best = float("inf")
    with torch.inference_mode():
        torch.mm(a, b)
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    return best


def linear_sizes(model: torch.nn.Module) -> tuple[int, int]:
    """(multiply-adds per token of every decoder-layer linear, those of the output head)."""
    head = model.get_output_embeddings()
    body = sum(
        m.in_features * m.out_features
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not head
    )
    return body, (head.in_features * head.out_features if head is not None else 0)


def linear_gflops(
    model: torch.nn.Module, computed_prompt_tokens: int, new_tokens: int, seconds: float
) -> float:
    body, head = linear_sizes(model)
    return 2 * (body * (computed_prompt_tokens + new_tokens) + head * new_tokens) / seconds / 1e9
