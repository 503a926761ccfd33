"""Decode tokens/s of the engine with each kernel set (`--kernels`) and CUDA-graph setting (`--cuda-graphs`),
same random model, same requests.

A random Llama-shaped model (GQA, 4 query heads per KV head) is built on the device in the dtype asked for;
for each batch size, every request has a random prompt of --prompt-len ids and asks for --new-tokens
tokens (ignore_eos). Decode tok/s = (new tokens - one per request) / (time of the whole run - time of the
same prompts with one new token), so prefill is left out. Meant for a GPU (benchmarks/gpu_check.sh), where
`triton` and `torch` are the sets to compare, each with decode steps eager and replayed from CUDA graphs
where `auto` captures them (`--cuda-graphs off,auto`, the default; `on` also captures the torch set, whose
decode attention then gathers every context column); it runs anywhere at a tiny --scale:

    python benchmarks/kernel_decode_speed.py                                  # triton vs torch, bf16
    python benchmarks/kernel_decode_speed.py --kernels triton --cuda-graphs off,auto
    python benchmarks/kernel_decode_speed.py --kernels native,torch --dtype float32 --scale tiny  # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vriksha.device as devices  # noqa: E402

SIZES = {  # hidden, layers, heads, kv heads, intermediate
    "tiny": (64, 2, 4, 1, 128),
    "small": (1024, 8, 16, 4, 2816),
    "1b": (2048, 16, 32, 8, 5632),
}


def build_model(size: str, vocab: int, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig

    hidden, layers, heads, kv_heads, inter = SIZES[size]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


def timed(llm, prompts, params) -> float:
    devices.synchronize(llm.engine.device)
    start = time.perf_counter()
    llm.generate(prompts, params)
    devices.synchronize(llm.engine.device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", default="triton,torch", help="kernel sets to compare, comma-separated")
    parser.add_argument(
        "--cuda-graphs",
        default="off,auto",
        help="--cuda-graphs settings to compare (off, auto, on), comma-separated",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default=None, help="default: the accelerator if there is one")
    parser.add_argument("--scale", default="1b", choices=sorted(SIZES))
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.scale == "tiny":
        args.prompt_len, args.new_tokens = min(args.prompt_len, 16), min(args.new_tokens, 8)

    from vriksha import LLM, SamplingParams
    from vriksha.loading import load_tokenizer, resolve_model_path

    device = devices.resolve(args.device)
    dtype = getattr(torch, args.dtype)
    tokenizer = load_tokenizer(resolve_model_path(None))
    model = build_model(args.scale, len(tokenizer), device, dtype)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    g = torch.Generator().manual_seed(1)
    rows = []
    print(f"{devices.describe(device)}, {args.dtype}, model {args.scale} {SIZES[args.scale]}", flush=True)
    print(f"{'kernels':<10} {'graphs':<6} {'batch':>5} {'decode tok/s':>13} {'run s':>8}", flush=True)
    settings = [(k, g) for k in args.kernels.split(",") for g in args.cuda_graphs.split(",")]
    if devices.is_host(device):
        settings = [(k, "off") for k in dict.fromkeys(k for k, _ in settings)]  # graphs need a CUDA device
    for name, graphs in settings:
        llm = LLM.from_module(
            model,
            tokenizer,
            kernels=name,
            cuda_graphs=graphs,
            max_model_len=args.prompt_len + args.new_tokens + 8,
            max_num_seqs=max(batch_sizes),
            kv_cache_memory_gb=None,
            enable_prefix_caching=False,
        )
        try:
            described = llm.engine.runner.kernels.describe()
            graphs_choice = llm.engine.runner.decode_graphs_choice
            print(f"{name}, --cuda-graphs {graphs}: {graphs_choice}", flush=True)
            for batch in batch_sizes:
                prompts = [
                    {
                        "prompt_token_ids": torch.randint(
                            0, len(tokenizer), (args.prompt_len,), generator=g
                        ).tolist()
                    }
                    for _ in range(batch)
                ]
                full = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
                first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
                timed(llm, prompts[:1], first)  # warm-up: compiles the kernels, fills allocator caches
                prefill_s = timed(llm, prompts, first)
                run_s = timed(llm, prompts, full)
                decode_tok_s = batch * (args.new_tokens - 1) / max(run_s - prefill_s, 1e-9)
                rows.append(
                    dict(kernels=name, set=described, cuda_graphs=graphs, graphs_choice=graphs_choice, batch=batch,
                         decode_tok_s=decode_tok_s, run_s=run_s)
                )  # fmt: skip
                print(f"{name:<10} {graphs:<6} {batch:>5} {decode_tok_s:>13.1f} {run_s:>8.2f}", flush=True)
        finally:
            llm.close()
    if args.json is not None:
        meta = dict(device=devices.describe(device), dtype=args.dtype, scale=args.scale, prompt_len=args.prompt_len,
                    new_tokens=args.new_tokens)  # fmt: skip
        args.json.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
