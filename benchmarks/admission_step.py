"""What a step costs that admits a new request into a running decode batch: its prompt's chunk attended as
decode rows (the default where the chunk is short) against the prefill path (as every prefill chunk ran
before), side by side in one engine, one process.

Four requests decode (40-token prompts); then, a few decode steps apart, `--admissions` new requests arrive
one at a time, and the step that admits each is timed. Two kinds of arrival:

- a short turn: a fresh prompt of `--short-len` tokens (a short chat message);
- a cached prompt: `--cached-len` tokens whose K/V the prefix cache already holds but for the last token
  (a repeated prompt, a K/V transfer from a prefill replica, the samples of one prompt).

Each kind runs `--rounds` times per path, alternating, and prints the median step of every round.

    python benchmarks/admission_step.py                 # embedded model, torch's threads
    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/admission_step.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vriksha.engine.runner.model_runner import ModelRunner

DECODING = 4


def admission_steps(llm, as_decode_rows: bool, prompt_len: int, cached: bool, admissions: int) -> float:
    """Median seconds of the steps that admitted a request."""
    from vriksha import SamplingParams

    engine = llm.engine
    chosen = ModelRunner._chunks_as_decode_rows
    if not as_decode_rows:  # the prefill path for every chunk
        ModelRunner._chunks_as_decode_rows = lambda self, batch: False
    try:
        engine.flush_cache()
        long_run = SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)
        for i in range(DECODING):
            engine.add_request({"prompt_token_ids": [100 + i] * 40}, long_run)
        for _ in range(20):
            engine.step()
        times = []
        for k in range(admissions):
            ids = [(7 * k + j) % 4000 + 200 for j in range(prompt_len)]
            if cached:
                rid = engine.add_request({"prompt_token_ids": ids}, SamplingParams(max_tokens=1))
                while any(
                    r.request_id == rid for r in [*engine.scheduler.waiting, *engine.scheduler.running]
                ):
                    engine.step()
            for _ in range(3):
                engine.step()
            engine.add_request({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=2))
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        for req in list(engine.scheduler.running) + list(engine.scheduler.waiting):
            engine.abort(req.request_id)
        while engine.has_unfinished:
            engine.step()
        return statistics.median(times)
    finally:
        ModelRunner._chunks_as_decode_rows = chosen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="model path (default: the embedded one)")
    parser.add_argument("--short-len", type=int, default=9, help="tokens of a short turn (default 9)")
    parser.add_argument("--cached-len", type=int, default=200, help="tokens of a cached prompt (default 200)")
    parser.add_argument("--admissions", type=int, default=12, help="timed admissions per run (default 12)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each path per kind (default 2)")
    args = parser.parse_args()

    from vriksha import LLM

    llm = LLM(model=args.model)
    runner = llm.engine.runner
    print(f"threads {torch.get_num_threads()}; native decode: {runner.native_decode_choice}")
    kinds = (
        (f"a {args.short_len}-token turn", args.short_len, False),
        (f"a {args.cached_len}-token prompt cached but its last token", args.cached_len, True),
    )
    for label, length, cached in kinds:
        rows: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for as_rows in (False, True):
                rows[as_rows].append(admission_steps(llm, as_rows, length, cached, args.admissions) * 1e3)
        before = " / ".join(f"{x:.1f}" for x in rows[False])
        after = " / ".join(f"{x:.1f}" for x in rows[True])
        ratio = statistics.mean(rows[False]) / statistics.mean(rows[True])
        print(
            f"{DECODING} decoding + {label}: prefill path {before} ms, as decode rows {after} ms ({ratio:.2f}x)"
        )


if __name__ == "__main__":
    main()
