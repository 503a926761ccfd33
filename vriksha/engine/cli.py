"""`vriksha generate`: generate from the embedded default or any local model, from the command line."""

from __future__ import annotations

import argparse
import json
import sys


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Engine options shared by every command that builds an engine."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="a local Transformers directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights and KV dtype")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the accelerator if present)")
    g.add_argument("--kv-cache-memory-gb", type=float, default=None,
                   help="KV pool size in GiB (default: 1 on the CPU, 40%% of free memory on an accelerator)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=1024, help="most tokens in one forward pass")
    g.add_argument("--chunked-prefill-size", type=int, default=512, help="most prompt tokens of one request per step")
    g.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable the radix prefix cache")
    g.add_argument("--no-fast-linear", action="store_true", help="always use F.linear on the CPU")
    g.add_argument("--no-fast-forward", action="store_true",
                   help="run every step through the Transformers forward instead of the engine's lean loop "
                        "over the same modules (Llama, Qwen2, Qwen3)")
    g.add_argument("--no-native-kernels", action="store_true",
                   help="do not compile and use the engine's C kernels (CPU fp32 decode attention over the KV "
                        "pool in place, bandwidth-bound linear layers); torch's kernels only")


def engine_config_from_args(args: argparse.Namespace):
    from vriksha.engine.config import EngineConfig

    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, kv_cache_memory_gb=args.kv_cache_memory_gb,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        chunked_prefill_size=args.chunked_prefill_size, max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching, fast_linear=not args.no_fast_linear,
        fast_forward=not args.no_fast_forward, native_kernels=not args.no_native_kernels,
    )


def register(subparsers) -> None:
    from vriksha.profiling import add_profile_args

    p = subparsers.add_parser(
        "generate",
        help="generate text with the engine",
        description="Generate completions for one or more prompts with the engine (continuous batching, "
        "radix prefix cache). Runs on the embedded SmolLM2-135M-Instruct unless --model is given.",
    )
    p.add_argument("--prompt", action="append", required=True,
                   help="a prompt (repeat for several; they run as one continuous batch)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per completion")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None, help="per-request seed: same seed, same output")
    p.add_argument("-n", type=int, default=1, help="completions per prompt")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated (one prompt)")
    add_engine_args(p)
    add_profile_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from vriksha.engine.llm import LLM
    from vriksha.engine.llm_engine import LLMEngine
    from vriksha.engine.sampling_params import SamplingParams
    from vriksha.profiling import ProfileConfig, StepProfiler

    params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        max_tokens=args.max_tokens, stop=args.stop,
    )
    llm = LLM(engine=LLMEngine(engine_config_from_args(args)))
    prompts = args.prompt
    if args.chat:
        prompts = [{"prompt_token_ids": llm.apply_chat_template([{"role": "user", "content": p}])} for p in prompts]
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
                print(json.dumps({"prompt": out.prompt, "index": comp.index, "text": comp.text,
                                  "finish_reason": comp.finish_reason, "num_tokens": len(comp.token_ids),
                                  "cached_tokens": out.num_cached_tokens}))
            else:
                head = out.prompt if out.prompt is not None else "(chat)"
                print(f"--- {head!r} [{comp.index}] ({comp.finish_reason})\n{comp.text}")
    if outputs:
        print(f"{generated} tokens in {elapsed:.2f} s ({generated / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    for path in traces:
        print(f"trace: {path}", file=sys.stderr)
    return 0
