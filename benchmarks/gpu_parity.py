"""Every tested decoder family (tests/engine/families.py) on the accelerator: the engine's greedy tokens
beside Transformers' generate() on the same device, per dtype and kernel set; prints a markdown table for
docs/models.md and exits 1 if an fp32 cell differs.

A cell is `=` when the engine's tokens equal generate()'s, else `@k`: the first of the new tokens where they
part (in bf16 that is expected at a near-tie of the logits, so only fp32 cells fail the run); `(graphs)` when
its decode steps replayed CUDA graphs (`--cuda-graphs`, auto by default: the lean-forward families on the
triton set). Run by benchmarks/gpu_check.sh:

    python benchmarks/gpu_parity.py --kernels triton,torch --dtypes float32,bfloat16
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vriksha.device as devices  # noqa: E402
from tests.engine.families import FAMILY_CONFIGS, VOCAB  # noqa: E402

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9], [2, 7, 1, 8]]
NEW_TOKENS = 12


def hf_greedy(model, prompt: list[int], device: torch.device) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def cell(family: str, dtype: torch.dtype, kernels: str, device, tokenizer, cuda_graphs: str = "auto") -> str:
    from transformers import AutoModelForCausalLM

    from vriksha import LLM, SamplingParams
    from vriksha.engine.runner.decode_graphs import DecodeGraphs

    config = FAMILY_CONFIGS[family]()
    config.vocab_size = VOCAB
    if hasattr(config, "get_text_config"):
        config.get_text_config().vocab_size = VOCAB
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    want = [hf_greedy(model, p, device) for p in PROMPTS]
    llm = LLM.from_module(
        copy.deepcopy(model),
        tokenizer,
        kernels=kernels,
        cuda_graphs=cuda_graphs,
        kv_cache_memory_gb=0.05,
        max_model_len=256,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        got = [
            o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        ]
        bound = llm.engine.runner.kernels.name
        graphs = llm.engine.runner.path(DecodeGraphs) is not None
    finally:
        llm.close()
    parts = [first_difference(list(g), w) for g, w in zip(got, want, strict=True)]
    mark = "=" if all(p is None for p in parts) else "@" + str(min(p for p in parts if p is not None))
    mark += " (graphs)" if graphs else ""
    return mark if bound == kernels else f"{mark} ({bound})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", default="triton,torch")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--families", default=",".join(sorted(FAMILY_CONFIGS)))
    parser.add_argument("--device", default=None, help="default: the accelerator if there is one")
    parser.add_argument("--cuda-graphs", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from vriksha.loading import load_tokenizer, resolve_model_path

    device = devices.resolve(args.device)
    tokenizer = load_tokenizer(resolve_model_path(None))
    columns = [(k, d) for d in args.dtypes.split(",") for k in args.kernels.split(",")]
    print(f"{devices.describe(device)}: engine greedy tokens vs generate() on the same device\n", flush=True)
    print("| family | " + " | ".join(f"{k} {d}" for k, d in columns) + " |")
    print("|---|" + "---|" * len(columns), flush=True)
    table, failed = {}, []
    for family in args.families.split(","):
        row = []
        for kernels, dtype in columns:
            try:
                mark = cell(family, getattr(torch, dtype), kernels, device, tokenizer, args.cuda_graphs)
            except Exception as exc:  # one family's failure is a cell, not the end of the run
                mark = f"error: {type(exc).__name__}: {str(exc)[:80]}"
            row.append(mark)
            if dtype == "float32" and not mark.startswith("="):
                failed.append(f"{family} {kernels} {dtype}: {mark}")
        table[family] = dict(zip([f"{k} {d}" for k, d in columns], row, strict=True))
        print(f"| {family} | " + " | ".join(row) + " |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(dict(device=devices.describe(device), cells=table), indent=2) + "\n")
    if failed:
        print("\nfp32 cells that differ:\n  " + "\n  ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
