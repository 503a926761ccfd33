"""Engine throughput beside Transformers (and llama.cpp where installed), same weights, one process run.

Workloads (tokens/s counts only the new tokens each request asked for):
  a  one stream, 256 new tokens
  b  64 requests x (128 random prompt ids + 128 new), ignore_eos
  c  8 groups x 8 requests: 512-token shared system prompt + 32 unique ids, 64 new; prefix-cache hit rate
  d  64 requests, prompt lengths U[16, 512], new tokens U[16, 256]

Systems: vriksha (this engine), hf-generate (Transformers generate(), static batches: all requests of a
workload in one left-padded batch, generating until the longest asks), hf-generate-batch (Transformers'
continuous batching, `generate_batch`), llama.cpp (llama-cpp-python on a GGUF given with --llama-gguf).

    python benchmarks/engine_throughput.py                       # everything, fp32
    python benchmarks/engine_throughput.py --dtype bfloat16 --systems vriksha,hf-generate
    python benchmarks/engine_throughput.py --scale 0.25          # a quick look: a quarter of the requests
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import time
from dataclasses import dataclass

import torch


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    new_tokens: list[int]

    @property
    def requested(self) -> int:
        return sum(self.new_tokens)


def make_workloads(vocab: int, scale: float, which: str) -> list[Workload]:
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    def count(n: int) -> int:
        return max(1, int(n * scale))

    out = []
    if "a" in which:
        out.append(Workload("a", [ids(32)], [256]))
    if "b" in which:
        n = count(64)
        out.append(Workload("b", [ids(128) for _ in range(n)], [128] * n))
    if "c" in which:
        groups = max(1, int(8 * scale))
        prompts = []
        for _ in range(groups):
            system = ids(512)
            prompts += [system + ids(32) for _ in range(8)]
        out.append(Workload("c", prompts, [64] * len(prompts)))
    if "d" in which:
        n = count(64)
        out.append(Workload("d", [ids(rng.randint(16, 512)) for _ in range(n)], [rng.randint(16, 256) for _ in range(n)]))
    return out


def run_vriksha(model_path, dtype, wl: Workload, engine_kwargs) -> dict:
    from vriksha import LLM, SamplingParams

    llm = LLM(model=str(model_path), dtype=dtype, **engine_kwargs)
    llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(temperature=0, max_tokens=4))  # warm-up
    llm.flush_cache()
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.new_tokens]
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in wl.prompts], params)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == wl.requested, (produced, wl.requested)
    stats = llm.stats()
    prompt_tokens = sum(len(p) for p in wl.prompts)
    return {"seconds": elapsed, "hit_rate": stats.cached_prompt_tokens / prompt_tokens}


def _hf_model(model_path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()


def run_hf_generate(model_path, dtype, wl: Workload, batch_size: int) -> dict:
    model = _hf_model(model_path, dtype)
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(wl.prompts), batch_size):
            prompts = wl.prompts[i : i + batch_size]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            model.generate(ids, attention_mask=mask, max_new_tokens=max(wl.new_tokens[i : i + batch_size]),
                           min_new_tokens=max(wl.new_tokens[i : i + batch_size]), do_sample=False, pad_token_id=0)
    return {"seconds": time.perf_counter() - start}


def run_hf_generate_batch(model_path, dtype, wl: Workload) -> dict | None:
    from transformers import GenerationConfig

    if len(set(wl.new_tokens)) != 1:
        return None  # one generation config per call: per-request lengths are not expressible
    model = _hf_model(model_path, dtype)
    cfg = GenerationConfig(max_new_tokens=wl.new_tokens[0], do_sample=False, eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate_batch(inputs=wl.prompts, generation_config=cfg)
    return {"seconds": time.perf_counter() - start}


def run_llama_cpp(gguf: str, wl: Workload, threads: int, parallel: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    if len(wl.prompts) > 1:
        return None  # the Python binding runs one sequence at a time; the server comparison is in the README
    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_batch=512, verbose=False, logits_all=False)
    prompt = wl.prompts[0]
    start = time.perf_counter()
    n = 0
    for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        n += 1
        if n >= wl.new_tokens[0]:
            break
    return {"seconds": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="Transformers directory (default: the embedded SmolLM2-135M)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--workloads", default="abcd")
    ap.add_argument("--systems", default="vriksha,hf-generate,hf-generate-batch,llama.cpp")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the requests to run in b, c, d")
    ap.add_argument("--hf-batch-size", type=int, default=64, help="static batch size for generate()")
    ap.add_argument("--llama-gguf", default=None, help="a GGUF of the same weights for llama.cpp")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    from vriksha.models import resolve_model_path

    path = resolve_model_path(args.model)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    systems = args.systems.split(",")
    threads = torch.get_num_threads()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{threads} threads, dtype {args.dtype}, model {path.name}")
    results: dict[str, dict[str, dict]] = {}
    for wl in make_workloads(vocab, args.scale, args.workloads):
        row = results.setdefault(wl.name, {})
        for system in systems:
            gc.collect()
            if system == "vriksha":
                r = run_vriksha(path, args.dtype, wl, {})
            elif system == "hf-generate":
                r = run_hf_generate(path, args.dtype, wl, args.hf_batch_size)
            elif system == "hf-generate-batch":
                r = run_hf_generate_batch(path, args.dtype, wl)
            elif system == "llama.cpp":
                r = run_llama_cpp(args.llama_gguf, wl, threads, 16) if args.llama_gguf else None
            else:
                raise SystemExit(f"unknown system {system!r}")
            if r is None:
                continue
            r["tok_s"] = wl.requested / r["seconds"]
            row[system] = r
            extra = f", cache hit {r['hit_rate']:.1%}" if "hit_rate" in r else ""
            print(f"  ({wl.name}) {system:18s} {r['tok_s']:8.1f} tok/s  ({wl.requested} tokens in {r['seconds']:.1f} s{extra})",
                  flush=True)
    print("\nworkload  " + "".join(f"{s:>18s}" for s in systems) + "   vriksha / best other")
    for name, row in results.items():
        cells = "".join(f"{row[s]['tok_s']:18.1f}" if s in row else f"{'-':>18s}" for s in systems)
        others = [v["tok_s"] for k, v in row.items() if k != "vriksha"]
        ratio = f"{row['vriksha']['tok_s'] / max(others):.2f}x" if others and "vriksha" in row else "-"
        print(f"  ({name})   {cells}   {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": args.dtype, "scale": args.scale, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
