"""Engine throughput beside Transformers and llama.cpp, same weights, one process run.

Workloads (tokens/s counts only the new tokens each request asked for):
  a  one stream, 256 new tokens
  b  64 requests x (128 random prompt ids + 128 new), ignore_eos
  c  8 groups x 8 requests: 512-token shared system prompt + 32 unique ids, 64 new; prefix-cache hit rate
  d  64 requests, prompt lengths U[16, 512], new tokens U[16, 256]

Systems: vriksha (this engine), hf-generate (Transformers generate(), static batches: all requests of a
workload in one left-padded batch, generating until the longest asks), hf-generate-batch (Transformers'
continuous batching, `generate_batch`), llama.cpp (llama-cpp-python in process on the GGUF given with
--llama-gguf; one sequence at a time, so workload a only), llama-server (llama.cpp's server binary given with
--llama-server, on the same GGUF: 16 slots, continuous batching, prompt cache, every request of a workload
in flight at once on its native /completion endpoint with token-id prompts).

The GGUF should hold the weights vriksha runs: `python benchmarks/make_f32_gguf.py` writes the embedded
model's dequantised weights as F32 to ~/.cache/vriksha/SmolLM2-135M-Instruct.F32.gguf. llama-server builds
CPU-only from the llama.cpp that llama-cpp-python's source distribution vendors (vendor/llama.cpp):

    cmake -S vendor/llama.cpp -B /tmp/llama-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    cmake --build /tmp/llama-build --target llama-server -j

    python benchmarks/engine_throughput.py                       # everything, fp32
    python benchmarks/engine_throughput.py --systems vriksha,llama.cpp,llama-server \\
        --llama-gguf ~/.cache/vriksha/SmolLM2-135M-Instruct.F32.gguf --llama-server /tmp/llama-build/bin/llama-server
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
import shlex
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

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
        out.append(
            Workload(
                "d", [ids(rng.randint(16, 512)) for _ in range(n)], [rng.randint(16, 256) for _ in range(n)]
            )
        )
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


def run_llama_cpp(gguf: str, wl: Workload, threads: int, parallel: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    if len(wl.prompts) > 1:
        return None  # the Python binding runs one sequence at a time; the llama-server system runs b, c, d
    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_batch=512, verbose=False, logits_all=False)
    prompt = wl.prompts[0]
    start = time.perf_counter()
    n = 0
    for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        n += 1
        if n >= wl.new_tokens[0]:
            break
    return {"seconds": time.perf_counter() - start}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slot_context(wl: Workload) -> int:
    """Context one server slot needs for the longest request of the workload, rounded up to 256."""
    need = max(len(p) + n for p, n in zip(wl.prompts, wl.new_tokens, strict=True)) + 16
    return -(-need // 256) * 256


def start_llama_server(binary: str, gguf: str, threads: int, slots: int, ctx: int, extra: list[str]):
    """Start llama-server on a free loopback port; returns (process, base url, log path) once /health is ok."""
    import httpx

    port = _free_port()
    cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads)]
    cmd += ["-tb", str(threads), "-np", str(slots), "-c", str(slots * ctx), "--cont-batching", "--no-webui"]
    cmd += extra
    fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    log = Path(name)
    with os.fdopen(fd, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            log.unlink(missing_ok=True)
            raise SystemExit(f"llama-server exited with {proc.returncode}: {shlex.join(cmd)}\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    stop_llama_server(proc)
    raise SystemExit(f"llama-server did not become healthy in 300 s; see {log}")


def llama_server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version")]
    return lines[0] if lines else "version unknown"


def stop_llama_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _completion(client, url: str, prompt: list[int], n_predict: int) -> dict:
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "ignore_eos": True,
        "temperature": 0,
        "cache_prompt": True,
        "stream": False,
    }
    r = client.post(url + "/completion", json=body)
    r.raise_for_status()
    return r.json()


def run_llama_server(
    binary: str, gguf: str, wl: Workload, threads: int, slots: int, extra: list[str]
) -> dict:
    """All requests of the workload in flight at once against a fresh llama-server; first send to last reply."""
    import httpx

    proc, url, log = start_llama_server(binary, gguf, threads, slots, _slot_context(wl), extra)
    try:
        timeout = httpx.Timeout(3600.0, connect=30.0)
        limits = httpx.Limits(max_connections=len(wl.prompts) + 1)
        with (
            httpx.Client(timeout=timeout, limits=limits) as client,
            ThreadPoolExecutor(len(wl.prompts)) as pool,
        ):
            _completion(client, url, [1, 2, 3], 4)  # warm-up, like the other systems
            start = time.perf_counter()
            futures = [
                pool.submit(_completion, client, url, p, n)
                for p, n in zip(wl.prompts, wl.new_tokens, strict=True)
            ]
            replies = [f.result() for f in futures]
            elapsed = time.perf_counter() - start
    finally:
        stop_llama_server(proc)
    log.unlink(missing_ok=True)
    produced = [r.get("tokens_predicted") for r in replies]
    assert produced == wl.new_tokens, (sum(filter(None, produced)), wl.requested)
    out = {"seconds": elapsed}
    cached = [r.get("timings", {}).get("cache_n") for r in replies]
    if all(c is not None for c in cached):
        out["hit_rate"] = sum(cached) / sum(len(p) for p in wl.prompts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="Transformers directory (default: the embedded SmolLM2-135M)"
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--workloads", default="abcd")
    ap.add_argument("--systems", default="vriksha,hf-generate,hf-generate-batch,llama.cpp,llama-server")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the requests to run in b, c, d")
    ap.add_argument("--hf-batch-size", type=int, default=64, help="static batch size for generate()")
    ap.add_argument(
        "--llama-gguf",
        default=None,
        help="a GGUF of the same weights for llama.cpp and llama-server (benchmarks/make_f32_gguf.py writes one)",
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
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    from vriksha.loading import resolve_model_path

    path = resolve_model_path(args.model)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    systems = args.systems.split(",")
    threads = torch.get_num_threads()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{threads} threads, dtype {args.dtype}, model {path.name}"
    )
    server_args = shlex.split(args.llama_server_args)
    if "llama-server" in systems and args.llama_server and args.llama_gguf:
        flags = shlex.join(["-t", str(threads), "-np", str(args.llama_slots), *server_args])
        print(
            f"llama-server: {llama_server_version(args.llama_server)}, {flags}, model {Path(args.llama_gguf).name}"
        )
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
            elif system == "llama-server":
                r = None
                if args.llama_gguf and args.llama_server:
                    r = run_llama_server(
                        args.llama_server, args.llama_gguf, wl, threads, args.llama_slots, server_args
                    )
            else:
                raise SystemExit(f"unknown system {system!r}")
            if r is None:
                continue
            r["tok_s"] = wl.requested / r["seconds"]
            row[system] = r
            extra = f", cache hit {r['hit_rate']:.1%}" if "hit_rate" in r else ""
            print(
                f"  ({wl.name}) {system:18s} {r['tok_s']:8.1f} tok/s  ({wl.requested} tokens in {r['seconds']:.1f} s{extra})",
                flush=True,
            )
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
