"""One stream's decode tokens/s and peak RSS of a model under one `quantization` mode, and its greedy tokens.

Each chat prompt runs alone, greedy, twice: once for one token and once for `--tokens`; decode tokens/s is
(tokens - 1) / (the difference of the two times), so prefill is left out. Run it once per mode (peak RSS is the
process's) and compare the printed JSON lines; the `tokens` must agree between modes that compute the same
numbers (`none` and `gguf` with float32 activations).

    python benchmarks/packed_decode.py --model qwen2.5-coder-0.5b-instruct --quantization gguf
    python benchmarks/packed_decode.py --model qwen2.5-coder-0.5b-instruct --quantization none
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does the SQL keyword JOIN do? Answer in two sentences.",
    "Fix the bug: def add(a, b): return a - b",
]


def main() -> None:
    from vriksha import LLM, SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--quantization", default="auto", choices=("none", "gguf", "int8", "auto"))
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(model=args.model, quantization=args.quantization)
    print(llm.engine.quantization.describe(), flush=True)
    full = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.chat([{"role": "user", "content": "Hi"}], one)  # the first step's one-off costs
    rates, tokens = [], []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        t0 = time.perf_counter()
        llm.chat(messages, one)
        t1 = time.perf_counter()
        out = llm.chat(messages, full)
        t2 = time.perf_counter()
        rates.append(round((args.tokens - 1) / ((t2 - t1) - (t1 - t0)), 3))
        tokens.append(list(out[0].outputs[0].token_ids))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = {
        "quantization": args.quantization,
        "mode": llm.engine.quantization.mode,
        "decode_tokens_s": rates,
        "peak_rss_mb": round(peak_mb),
        "load_average": os.getloadavg()[0],
        "tokens": tokens,
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
