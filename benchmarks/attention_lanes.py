"""The bf16 pool's attention lanes on AMX tiles against AVX512-BF16 instructions, side by side, one process.

Two shapes of the shared-prefix workload (c) with the embedded model's heads (9 query heads, 3 KV heads, 64
values each), one layer: a prompt chunk of 32 tokens over a cached 512-token prefix (the prompt-chunk kernel,
its slots consecutive as a fresh prompt's are, and shuffled), and a decode step of 16 rows in two groups of 8
sharing 512 slots with 48 of their own (the shared-prefix pass, then each row's own slots). Each round times
both instruction sets in alternating order; prints the rounds' medians, their ratio and the largest
difference between the two outputs. Needs a CPU with AMX-BF16 (Linux granting the tile state) for the AMX
column; elsewhere it says so and times the other alone.

    python benchmarks/attention_lanes.py
    python benchmarks/attention_lanes.py --rounds 9 --calls 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vriksha.engine.platform.native import kernels  # noqa: E402

HEADS, KV_HEADS, D = 9, 3, 64


def _time(call, calls: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both (medians reported)")
    parser.add_argument("--calls", type=int, default=100, help="calls timed per round and instruction set")
    args = parser.parse_args()
    lib = kernels()
    if lib is None:
        raise SystemExit("the native kernels did not build (no C compiler?): nothing to time")
    has_amx = lib.attention_amx()
    gen = torch.Generator().manual_seed(0)
    pool = 4000
    k_pool = torch.randn(pool, KV_HEADS, D, generator=gen).to(torch.bfloat16)
    v_pool = torch.randn(pool, KV_HEADS, D, generator=gen).to(torch.bfloat16)
    q_chunk = torch.randn(32, HEADS, D, generator=gen)
    lens = torch.tensor([560] * 16)
    rows = torch.zeros(16, 560, dtype=torch.int64)
    own = iter((torch.randperm(2000, generator=gen) + 2000).tolist())
    for b in range(16):
        start = 100 if b < 8 else 700
        rows[b, :512] = torch.arange(start, start + 512)
        rows[b, 512:] = torch.tensor([next(own) for _ in range(48)])
    q_decode = torch.randn(16, HEADS, D, generator=gen).to(torch.bfloat16)
    consecutive, shuffled = torch.arange(1000, 1544), torch.randperm(pool - 1, generator=gen)[:544] + 1
    cases = {
        "prompt chunk, 32 over 512, consecutive slots": lambda: lib.prefill_attention(
            q_chunk, k_pool, v_pool, consecutive, D**-0.5
        ),
        "prompt chunk, 32 over 512, shuffled slots": lambda: lib.prefill_attention(
            q_chunk, k_pool, v_pool, shuffled, D**-0.5
        ),
        "decode, 16 rows in 2 groups over 512 shared + 48 own": lambda: lib.decode_attention(
            q_decode, k_pool, v_pool, rows, lens, D**-0.5, None
        ),
    }
    sets = ["avx512_bf16", "amx"] if has_amx else ["avx512_bf16"]
    print(
        f"kernels {lib.variant.name}, {torch.get_num_threads()} threads, one layer, ms a call (median of rounds)"
    )
    if not has_amx:
        print(
            "no AMX here (the CPU lacks amx_bf16/amx_tile or the OS refused the tile state): AVX512-BF16 alone"
        )
    try:
        for name, call in cases.items():
            times: dict[str, list[float]] = {s: [] for s in sets}
            outs = {}
            for r in range(args.rounds):
                for s in sets if r % 2 == 0 else sets[::-1]:
                    lib.attention_amx(s == "amx")
                    outs[s] = call()
                    times[s].append(_time(call, args.calls))
            med = {s: statistics.median(t) * 1e3 for s, t in times.items()}
            line = "  ".join(f"{s} {med[s]:.3f}" for s in sets)
            if has_amx:
                diff = (outs["amx"] - outs["avx512_bf16"]).abs().max().item()
                line += f"  ratio {med['avx512_bf16'] / med['amx']:.2f}x  max difference {diff:.1e}"
            print(f"  {name}: {line}")
    finally:
        lib.attention_amx(True)


if __name__ == "__main__":
    main()
