"""llama.cpp as a peer in benchmarks/engine_throughput.py: llama-cpp-python in process (one sequence) and the
llama-server binary (continuous batching, every request of a workload in flight), on one or more GGUF files.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from vriksha.net.launch import free_port

if TYPE_CHECKING:
    from engine_throughput import Workload


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


def _slot_context(wl: Workload) -> int:
    """Context one server slot needs for the longest request of the workload, rounded up to 256."""
    need = max(len(p) + n for p, n in zip(wl.prompts, wl.new_tokens, strict=True)) + 16
    return -(-need // 256) * 256


def start_llama_server(binary: str, gguf: str, threads: int, slots: int, ctx: int, extra: list[str]):
    """Start llama-server on a free loopback port; returns (process, base url, log path) once /health is ok."""
    import httpx

    port = free_port()
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
            raise SystemExit(f"llama-server {_exit_reason(proc.returncode)}: {shlex.join(cmd)}\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    stop_llama_server(proc)
    raise SystemExit(f"llama-server did not become healthy in 300 s; see {log}")


def _exit_reason(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    reason = f"was killed by {name}"
    if name in ("SIGILL", "SIGSEGV"):
        # seen on a VM exposing AMX: ggml's AMX matmul faults at its first tile configuration
        reason += (
            " (an instruction the CPU or VM refused? if the log stops at the first matmul on an AMX machine, build"
            " llama-server with -DGGML_NATIVE=OFF and the AVX-512 options but not the AMX ones, or pass"
            " --llama-server-args=--no-repack to keep ggml off its AMX buffers)"
        )
    return reason


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


def gguf_files(spec: str | None) -> list[Path]:
    """--llama-gguf: comma-separated GGUF paths; `embedded` is the embedded model's own (quantised) file."""
    from vriksha.loading.loader import default_gguf_path

    files = []
    for part in filter(None, (spec or "").split(",")):
        path = default_gguf_path() if part == "embedded" else Path(part).expanduser()
        if not path.is_file():
            raise SystemExit(
                f"--llama-gguf: {path} is not a file (benchmarks/make_f32_gguf.py writes the F32 one)"
            )
        files.append(path)
    return files


def gguf_type(path: Path) -> str:
    """The weight type a GGUF's name carries (SmolLM2-135M-Instruct.Q4_1.gguf -> Q4_1), else its stem."""
    m = re.search(r"[.-](I?Q\d\w*|F32|F16|BF16)$", path.stem, re.IGNORECASE)
    return m.group(1).upper() if m else path.stem
