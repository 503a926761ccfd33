"""Multi-LoRA serving throughput: a batch mixing 4 adapters and the base model against the base model alone.

Workloads (from benchmarks/engine_throughput.py, tokens/s counting the new tokens asked for):
  b  64 requests x (128 random prompt ids + 128 new), ignore_eos
  d  64 requests, prompt lengths U[16, 512], new tokens U[16, 256]
  a  one stream, 256 new tokens (with an adapter against without)

Systems, each one engine over the embedded model (or --model) with its defaults, built once and reused:
  base        --enable-lora off: every request on the base model (the engine as it is without LoRA)
  base-lora   --enable-lora on, every request on the base model (what turning LoRA on costs base traffic)
  mixed       --enable-lora on, requests round-robin over 4 adapters and the base model (one engine step
              mixes them: one base matmul per layer, each adapter's x A B on its own rows)
  adapter     --enable-lora on, every request on one adapter
  mixed-torch, adapter-torch
              the same with the native decode step's LoRA deltas off: steps with adapter rows take the lean
              forward, which adds the deltas with torch matmuls (how every such step ran before the native
              step took them)

The adapters are random, rank --rank (default 16), on every linear layer of the decoder (q, k, v, o, gate, up,
down), so each adds its full low-rank cost. Decode steps with adapter rows run in the native decode step, which
adds the deltas in C after each base matmul (`runner/native_lora.py`). Systems take
turns run by run (--repeat, default 3) so that every one meets the machine's slow and fast minutes alike; the
table gives each median run and the ratio to `base` (target for mixed: at least 0.7x).

    python benchmarks/lora_serving.py                      # b, d and a, 3 runs each
    python benchmarks/lora_serving.py --workloads b --scale 0.25 --repeat 1 --out lora.json
    python benchmarks/lora_serving.py --workloads bda --scale 0.25 --repeat 1 --native-decode on
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_throughput import Workload, make_workloads  # noqa: E402

from vriksha.engine.runner.native_decode import NativeDecode  # noqa: E402
from vriksha.lora import LoraAdapter, LoraWeights  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SYSTEMS = ("base", "base-lora", "mixed", "adapter", "mixed-torch", "adapter-torch")
NUM_ADAPTERS = 4


def random_adapters(model: torch.nn.Module, rank: int, count: int) -> list[LoraAdapter]:
    """`count` random adapters of rank `rank` on every decoder linear layer of `model`."""
    out = []
    for i in range(count):
        g = torch.Generator().manual_seed(i)
        modules = {}
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
                a = torch.randn(rank, m.in_features, generator=g) / m.in_features**0.5
                b = torch.randn(m.out_features, rank, generator=g) * 0.01
                modules[name] = LoraWeights(a, b)
        out.append(LoraAdapter(f"adapter{i}", rank, float(rank), TARGETS, modules))
    return out


def build(system: str, args: argparse.Namespace):
    from vriksha import LLM

    lora = system != "base"
    options = dict(enable_lora=True, max_loras=NUM_ADAPTERS, max_lora_rank=args.rank) if lora else {}
    llm = LLM(model=args.model, native_decode=args.native_decode, **options)
    if lora:
        for adapter in random_adapters(llm.engine.model, args.rank, NUM_ADAPTERS):
            llm.engine.add_lora(adapter)
    native = llm.engine.runner.path(NativeDecode)
    if system.endswith("-torch") and native is not None:
        native.lora_deltas = False
    print(f"  {system}: native decode {llm.engine.runner.native_decode_choice}", flush=True)
    return llm


def adapters_for(system: str, n: int) -> list[str | None]:
    system = system.removesuffix("-torch")
    if system in ("base", "base-lora"):
        return [None] * n
    if system == "adapter":
        return ["adapter0"] * n
    cycle = [*(f"adapter{i}" for i in range(NUM_ADAPTERS)), None]
    return [cycle[i % len(cycle)] for i in range(n)]


def run(llm, system: str, wl: Workload) -> float:
    from vriksha import SamplingParams

    llm.flush_cache()
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.new_tokens]
    loras = adapters_for(system, len(wl.prompts))
    if wl.name == "a" and system.startswith("mixed"):
        loras = ["adapter0"]
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in wl.prompts], params, lora=loras)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == wl.requested, (produced, wl.requested)
    return produced / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--workloads", default="bda", help="which of b, d, a (default: bda)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated of {', '.join(SYSTEMS)}")
    p.add_argument(
        "--native-decode",
        default="auto",
        choices=("auto", "on", "off"),
        help="the engines' native decode choice (default auto; on: every decode batch up to 64 natively, so a "
        "choice measured on a busy machine does not decide the comparison)",
    )
    p.add_argument("--rank", type=int, default=16, help="the adapters' rank (default: 16)")
    p.add_argument("--scale", type=float, default=1.0, help="scale the request counts of b and d")
    p.add_argument("--repeat", type=int, default=3, help="runs per system and workload (median kept)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    engines = {s: build(s, args) for s in systems}
    vocab = int(next(iter(engines.values())).engine.vocab_size)
    results: dict[str, dict[str, list[float]]] = {}
    for wl in make_workloads(vocab, args.scale, args.workloads):
        for s in systems:  # warm-up: one short request per engine
            engines[s].generate({"prompt_token_ids": [1, 2, 3]}, lora=adapters_for(s, 1))
        runs: dict[str, list[float]] = {s: [] for s in systems}
        for _ in range(args.repeat):
            for s in systems:
                runs[s].append(run(engines[s], s, wl))
        results[wl.name] = runs
        base = statistics.median(runs["base"]) if "base" in runs else None
        print(f"workload {wl.name}: {len(wl.prompts)} requests, {wl.requested} new tokens", flush=True)
        for s in systems:
            med = statistics.median(runs[s])
            ratio = f"  {med / base:.2f}x base" if base else ""
            spread = f"[{min(runs[s]):.1f}, {max(runs[s]):.1f}]"
            print(f"  {s:<10} {med:8.1f} tok/s {spread}{ratio}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"rank": args.rank, "tokens_per_s": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
