"""`vriksha generate`: generate from the embedded default or any local model, from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from vriksha.engine.config import EngineConfig


def register(subparsers) -> None:
    from vriksha.profiling import add_profile_args

    p = subparsers.add_parser(
        "generate",
        help="generate text with the engine",
        description="Generate completions for one or more prompts with the engine (continuous batching, "
        "radix prefix cache). Runs on the embedded SmolLM2-135M-Instruct unless --model is given.",
    )
    p.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="a prompt (repeat for several; they run as one continuous batch)",
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap each prompt as a user message in the chat template"
    )
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per completion")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None, help="per-request seed: same seed, same output")
    p.add_argument("-n", type=int, default=1, help="completions per prompt")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated (one prompt)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print the engine's dtype choice, the CPU flags it saw, its quantization choice, and when each "
        "of this machine's timings it used was measured and under what load",
    )
    EngineConfig.add_arguments(p)
    add_profile_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from vriksha.engine.llm import LLM
    from vriksha.engine.sampling_params import SamplingParams
    from vriksha.profiling import ProfileConfig, StepProfiler

    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=args.stop,
    )
    llm = LLM(config=EngineConfig.from_args(args))
    if args.verbose:
        engine = llm.engine
        kernels = engine.runner.kernels.describe()
        print(
            f"engine: {engine.model_name}, {engine.dtype_choice.describe()}; kernels {kernels}",
            file=sys.stderr,
        )
        print(f"engine: {engine.quantization.describe()}", file=sys.stderr)
        print(f"engine: native decode {engine.runner.native_decode_choice}", file=sys.stderr)
        print(f"engine: CUDA graphs {engine.runner.decode_graphs_choice}", file=sys.stderr)
        print(f"engine: matmuls {engine.runner.matmul_choice}", file=sys.stderr)
        if engine.host_malloc is not None:
            print(f"engine: {engine.host_malloc.describe()}", file=sys.stderr)
        kv = str(engine.pool.dtype).removeprefix("torch.")
        print(f"engine: KV pool {kv} (kv_cache_dtype {engine.config.kv_cache_dtype})", file=sys.stderr)
        from vriksha import timing_load

        for line in timing_load.report():
            print(f"engine: timings: {line}", file=sys.stderr)
    prompts = args.prompt
    if args.chat:
        prompts = [
            {"prompt_token_ids": llm.apply_chat_template([{"role": "user", "content": p}])} for p in prompts
        ]
    profiler = StepProfiler(ProfileConfig.from_args(args), rank=0, name="generate")
    profiler.start()
    llm.engine.step_hooks.append(profiler.step)
    start = time.perf_counter()
    try:
        if args.stream and len(prompts) == 1:
            printed = 0
            for out in llm.stream(prompts[0], params):
                text = out.outputs[0].text
                sys.stdout.write(text[printed:])
                sys.stdout.flush()
                printed = len(text)
            sys.stdout.write("\n")
            outputs = []
        else:
            outputs = llm.generate(prompts, params, use_tqdm=len(prompts) > 1)
    finally:
        traces = profiler.stop()
    elapsed = time.perf_counter() - start
    generated = 0
    for out in outputs:
        for comp in out.outputs:
            generated += len(comp.token_ids)
            if args.json:
                print(
                    json.dumps(
                        {
                            "prompt": out.prompt,
                            "index": comp.index,
                            "text": comp.text,
                            "finish_reason": comp.finish_reason,
                            "num_tokens": len(comp.token_ids),
                            "cached_tokens": out.num_cached_tokens,
                        }
                    )
                )
            else:
                head = out.prompt if out.prompt is not None else "(chat)"
                print(f"--- {head!r} [{comp.index}] ({comp.finish_reason})\n{comp.text}")
    if outputs:
        print(
            f"{generated} tokens in {elapsed:.2f} s ({generated / max(elapsed, 1e-9):.1f} tok/s)",
            file=sys.stderr,
        )
    for path in traces:
        print(f"trace: {path}", file=sys.stderr)
    return 0
