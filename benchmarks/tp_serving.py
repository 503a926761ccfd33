"""What tensor-parallel serving's choices cost on this machine: the step broadcast and the LM head.

    python benchmarks/tp_serving.py                      # both, 2 ranks, the embedded model's head shape
    python benchmarks/tp_serving.py --ranks 3 --iters 500
    python benchmarks/tp_serving.py --ranks 3 --engine            # + the embedded model's tokens/s, 1 vs 3 ranks

1. The step broadcast (`vriksha/engine/tensor_parallel/step.py`): rank 0 hands every step's batch to the
   other ranks. Compared: a gloo broadcast of the header and the payload (what the engine does) against a
   shared-memory buffer with one event per rank (nano-vllm's way), each followed by the one-element
   all-reduce that stands for the forward pass's first collective; the bare all-reduce is subtracted.
   Sizes: decode of 1 and of 64 requests at 1,000 tokens of context, a 512-token prefill chunk.
2. The LM head: replicated, rank 0 alone computing [rows, vocab] logits (what the engine does), against
   split over the vocabulary, each rank computing vocab / N columns and rank 0 gathering them.
3. With `--engine`: the engine itself, `LLM(model, tensor_parallel_size=N)` against one rank: greedy
   generation of `--batch` prompts x `--max-tokens` tokens, tokens per second (after a warm-up call).

Timings on a shared CPU are noise; read the ratios on an idle machine. Prints one table per part.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from multiprocessing import shared_memory

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = {
    "decode x1 (ctx 1000)": 3 + 1 + 1000,
    "decode x64 (ctx 1000)": 3 * 64 + 64 + 64_000,
    "prefill 512": 3 * 512 + 3 + 512,
}
HEADER = 6


def _time(fn, iters: int) -> float:
    for _ in range(max(3, iters // 10)):
        fn()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _rank(rank: int, size: int, port: int, events, shm_name: str, args, results) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    shm = shared_memory.SharedMemory(name=shm_name)
    buf = torch.frombuffer(shm.buf, dtype=torch.int64)
    one = torch.ones(1)

    def sync() -> None:
        dist.all_reduce(one)

    def gloo(header: torch.Tensor, payload: torch.Tensor) -> None:
        if rank == 0:
            dist.broadcast(header, 0)
            dist.broadcast(payload, 0)
        else:
            h = torch.empty(HEADER, dtype=torch.int64)
            dist.broadcast(h, 0)
            dist.broadcast(torch.empty(int(h[1]), dtype=torch.int64), 0)
        sync()

    def shm_step(header: torch.Tensor, payload: torch.Tensor) -> None:
        n = payload.numel()
        if rank == 0:
            buf[:HEADER] = header
            buf[HEADER : HEADER + n] = payload
            for e in events:
                e.set()
        else:
            events[rank - 1].wait()
            events[rank - 1].clear()
            buf[HEADER : HEADER + int(buf[1])].clone()
        sync()

    out = {}
    base = _time(sync, args.iters)
    for name, n in SIZES.items():
        msg = (torch.tensor([1, n, 0, 0, 0, 0], dtype=torch.int64), torch.arange(n, dtype=torch.int64))
        out[name] = (
            _time(lambda m=msg: gloo(*m), args.iters) - base,
            _time(lambda m=msg: shm_step(*m), args.iters) - base,
        )

    # the LM head: replicated on rank 0 vs split over the vocabulary and gathered
    def replicated(x: torch.Tensor, w: torch.Tensor | None) -> None:
        if rank == 0:
            torch.nn.functional.linear(x, w)
        sync()

    def split(x: torch.Tensor, w: torch.Tensor) -> None:
        part = torch.nn.functional.linear(x, w)
        dist.gather(part, [torch.empty_like(part) for _ in range(size)] if rank == 0 else None, dst=0)

    heads = {}
    w_full = torch.randn(args.vocab, args.hidden) if rank == 0 else None
    w_part = torch.randn(args.vocab // size, args.hidden)
    for rows in (1, 64):
        x = torch.randn(rows, args.hidden)
        heads[rows] = (
            _time(lambda x=x: replicated(x, w_full), args.iters // 5),
            _time(lambda x=x: split(x, w_part), args.iters // 5),
        )
    if rank == 0:
        results.put((out, heads))
    dist.barrier()
    dist.destroy_process_group()
    shm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--hidden", type=int, default=576, help="the embedded model's hidden size")
    p.add_argument("--vocab", type=int, default=49152, help="the embedded model's vocabulary")
    p.add_argument("--engine", action="store_true", help="also time the engine on 1 and on N ranks")
    p.add_argument("--model", default=None, help="for --engine (default: the embedded SmolLM2-135M)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, args.ranks + 1, is_master=True, wait_for_workers=False)
    shm = shared_memory.SharedMemory(create=True, size=8 * (HEADER + max(SIZES.values())))
    events = [ctx.Event() for _ in range(args.ranks - 1)]
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, args.ranks, store.port, events, shm.name, args, results))
        for r in range(args.ranks)
    ]
    for proc in procs:
        proc.start()
    try:
        out, heads = results.get(timeout=1800)
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
        shm.close()
        shm.unlink()
    print(f"\nstep broadcast, {args.ranks} ranks (median us per step, the bare all-reduce subtracted)")
    print("| step | int64s | gloo broadcast | shared memory + events |\n|---|---|---|---|")
    for name, (g, s) in out.items():
        print(f"| {name} | {SIZES[name]} | {g * 1e6:.0f} | {s * 1e6:.0f} |")
    print(f"\nLM head [{args.vocab} x {args.hidden}], {args.ranks} ranks (median ms per step)")
    print("| rows | replicated, rank 0 computes | split by vocabulary + gather |\n|---|---|---|")
    for rows, (r, s) in heads.items():
        print(f"| {rows} | {r * 1e3:.2f} | {s * 1e3:.2f} |")
    if args.engine:
        print(f"\nengine, {args.batch} prompts x {args.max_tokens} tokens, greedy (tokens/s)")
        print("| ranks | tokens/s |\n|---|---|")
        for ranks in (1, args.ranks):
            print(f"| {ranks} | {_engine_tokens_per_s(args, ranks):.1f} |", flush=True)
    os._exit(0)


def _engine_tokens_per_s(args, ranks: int) -> float:
    from vriksha import LLM, SamplingParams

    prompts = [{"prompt_token_ids": [(13 * i + j) % 200 + 1 for j in range(16)]} for i in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    with LLM(args.model, tensor_parallel_size=ranks, kv_cache_memory_gb=0.1, max_model_len=1024) as llm:
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))
        llm.flush_cache()
        t = time.perf_counter()
        llm.generate(prompts, params)
        return args.batch * args.max_tokens / (time.perf_counter() - t)


if __name__ == "__main__":
    main()
