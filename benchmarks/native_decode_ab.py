"""One stream decoding with and without native decode steps, side by side in one engine, one process.

The engine is built once (`native_decode="on"`); each round decodes the same prompt greedily twice, once with
every decoder layer of a decode step in one native call and once with the lean Python forward, in alternating
order, and prints both speeds and their ratio (rounds' medians). The greedy tokens of both must agree.

    python benchmarks/native_decode_ab.py                       # embedded model, its own 4-bit weights
    python benchmarks/native_decode_ab.py --quantization none --tokens 128 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="model path (default: the embedded one)")
    parser.add_argument("--quantization", default="auto", help="engine quantization option")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per run")
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds")
    args = parser.parse_args()

    from vriksha import LLM, SamplingParams
    from vriksha.engine.runner.native_decode import NativeDecode

    llm = LLM(model=args.model, quantization=args.quantization, native_decode="on")
    runner = llm.engine.runner
    fused = runner.path(NativeDecode)
    chain = list(runner.paths)
    print(f"threads {torch.get_num_threads()}; {llm.engine.quantization.describe()}")
    print(f"native decode: {runner.native_decode_choice}")
    if fused is None:
        raise SystemExit("native decode does not run here; nothing to compare")
    prompt = {"prompt_token_ids": list(range(1000, 1032))}
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8))  # warm-up

    def run(native: bool) -> tuple[float, list[int]]:
        runner.paths = chain if native else [p for p in chain if p is not fused]
        llm.flush_cache()
        start = time.perf_counter()
        out = llm.generate(prompt, params)[0].outputs[0].token_ids
        return args.tokens / (time.perf_counter() - start), list(out)

    speeds: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list[int]] = {}
    for r in range(args.rounds):
        for native in (True, False) if r % 2 == 0 else (False, True):
            tok_s, tokens[native] = run(native)
            speeds[native].append(tok_s)
    runner.paths = chain
    a, b = statistics.median(speeds[True]), statistics.median(speeds[False])
    print(f"native decode {a:.1f} tok/s, lean forward {b:.1f} tok/s: {a / b:.2f}x")
    print(f"greedy tokens equal: {tokens[True] == tokens[False]}")


if __name__ == "__main__":
    main()
