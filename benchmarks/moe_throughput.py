"""A mixture-of-experts model through the engine beside Transformers' generate(), one process run.

The model is a random Qwen3-MoE config of a size that makes the experts dominate (hidden 512, 8 layers, 32
experts of width 256, 4 routed per token), saved once with the embedded model's tokenizer. The engine runs the
family's own expert code (Transformers 5 groups each step's tokens by expert) with the experts implementation
Transformers picks, under its scheduler, KV pool and attention; the router's top-k is Transformers' own.
Workloads are engine_throughput.py's (a: one stream; b: a batch of equal requests; d: mixed lengths).

    python benchmarks/moe_throughput.py                 # workloads a, b, d at a quarter scale
    python benchmarks/moe_throughput.py --scale 1 --json docs/figures/moe_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import make_workloads, run_hf_generate, run_vriksha  # noqa: E402


def build_model(out: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from vriksha.loading import load_tokenizer, resolve_model_path

    if (out / "config.json").is_file():
        return out
    tokenizer = load_tokenizer(resolve_model_path(None))
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        num_experts=32,
        num_experts_per_tok=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", default="abd", help="which of engine_throughput's workloads (a, b, d)")
    parser.add_argument(
        "--scale", type=float, default=0.25, help="fraction of engine_throughput's request counts"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads for both systems")
    parser.add_argument(
        "--model-dir", type=Path, default=Path.home() / ".cache" / "vriksha" / "bench-qwen3-moe"
    )
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = build_model(args.model_dir)
    rows = []
    for wl in make_workloads(vocab=49152, scale=args.scale, which=args.workloads):
        ours = run_vriksha(path, "float32", wl, {"kv_cache_memory_gb": 1.0})
        theirs = run_hf_generate(path, "float32", wl, batch_size=len(wl.prompts))
        row = {
            "workload": wl.name,
            "requests": len(wl.prompts),
            "new_tokens": wl.requested,
            "vriksha_tok_s": wl.requested / ours["seconds"],
            "hf_generate_tok_s": wl.requested / theirs["seconds"],
        }
        row["ratio"] = row["vriksha_tok_s"] / row["hf_generate_tok_s"]
        rows.append(row)
        print(
            f"({wl.name}) {len(wl.prompts)} requests: vriksha {row['vriksha_tok_s']:.1f} tok/s, "
            f"generate() {row['hf_generate_tok_s']:.1f} tok/s, {row['ratio']:.2f}x",
            flush=True,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        machine = {
            "cpu": platform.processor() or platform.machine(),
            "threads": args.threads,
            "torch": torch.__version__,
        }
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
