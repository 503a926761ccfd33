"""The engine's native CPU kernels (`kernels.c`), compiled on first use with the system C compiler.

The shared library is built once per source, compiler and CPU into `$VRIKSHA_CACHE/native/` and loaded with
ctypes; it links the OpenMP runtime torch has already loaded, so both share one thread pool. Without a C
compiler, or with `VRIKSHA_NATIVE=0`, `kernels()` returns None and the engine keeps its torch paths.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from vriksha.cache import cache_dir

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
_I64, _F32, _PTR, _INT = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str) -> Path:
    source = SOURCE.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(source + version.encode() + _cpu_signature().encode() + platform.machine().encode())
    target = cache_dir() / "native" / f"kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    base = [compiler, "-O3", "-march=native", "-shared", "-fPIC", str(SOURCE)]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        errors = ""
        for extra in (["-fopenmp"], []):  # a compiler without OpenMP still gives single-threaded kernels
            done = subprocess.run([*base, *extra, "-o", str(out), "-lm"], capture_output=True, text=True)
            if done.returncode == 0:
                os.replace(out, target)  # atomic: processes building at once all end with one whole file
                return target
            errors = done.stderr
        raise RuntimeError(f"{compiler} could not build {SOURCE.name}: {errors.strip()[-2000:]}")


class Kernels:
    """Typed entry points of the loaded library; inputs must be fp32, on the CPU and contiguous."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.linear_f32.argtypes = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]
        lib.linear_f32.restype = None
        lib.decode_attention_f32.argtypes = [_PTR] * 6 + [_I64] * 6 + [_F32, _I64, _INT]
        lib.decode_attention_f32.restype = None
        lib.rms_norm_f32.argtypes = [_PTR] * 4 + [_I64, _I64, _F32, _INT]
        lib.rms_norm_f32.restype = None
        lib.rope_f32.argtypes = [_PTR] * 3 + [_I64] * 3 + [_INT]
        lib.rope_f32.restype = None
        lib.silu_mul_f32.argtypes = [_PTR] * 3 + [_I64, _INT]
        lib.silu_mul_f32.restype = None
        self._lib = lib
        self.path = path

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] @ weight[out, in].T (+ bias): the weight is read in place, once per call."""
        rows, in_f = x.shape
        out_f = weight.shape[0]
        y = torch.empty(rows, out_f, dtype=torch.float32)
        self._lib.linear_f32(
            weight.data_ptr(),
            bias.data_ptr() if bias is not None else None,
            x.data_ptr(),
            y.data_ptr(),
            out_f,
            in_f,
            rows,
            torch.get_num_threads(),
        )
        return y

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """RMSNorm of x [..., dim] times weight; with `residual`, x += residual first (x is updated in place)."""
        dim = x.shape[-1]
        out = torch.empty_like(x)
        self._lib.rms_norm_f32(
            x.data_ptr(),
            residual.data_ptr() if residual is not None else None,
            weight.data_ptr(),
            out.data_ptr(),
            x.numel() // dim,
            dim,
            eps,
            torch.get_num_threads(),
        )
        return out

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding in place: x [tokens, heads, dim]; cos, sin [tokens, dim]."""
        tokens, heads, dim = x.shape
        self._lib.rope_f32(
            x.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens, heads, dim, torch.get_num_threads()
        )
        return x

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(gate)
        self._lib.silu_mul_f32(
            gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), torch.get_num_threads()
        )
        return out

    def decode_attention(
        self,
        q: torch.Tensor,  # [B, H, D]
        k_pool: torch.Tensor,  # [S, Hkv, D]
        v_pool: torch.Tensor,  # [S, Hkv, Dv]
        slots: torch.Tensor,  # [B, max_len] int64
        lens: torch.Tensor,  # [B] int64
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """Softmax attention of one query per request over its KV slots, read from the pool in place."""
        batch, heads, d = q.shape
        kv_heads, dv = v_pool.shape[1], v_pool.shape[2]
        out = torch.empty(batch, heads, dv, dtype=torch.float32)
        self._lib.decode_attention_f32(
            q.data_ptr(),
            k_pool.data_ptr(),
            v_pool.data_ptr(),
            slots.data_ptr(),
            lens.data_ptr(),
            out.data_ptr(),
            batch,
            heads,
            kv_heads,
            d,
            dv,
            slots.shape[1],
            scale,
            window or 0,
            torch.get_num_threads(),
        )
        return out


@functools.cache
def kernels() -> Kernels | None:
    """The native kernels, built on first call; None where they cannot run (the reason is logged once)."""
    if os.environ.get("VRIKSHA_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found (set CC): the engine uses torch's CPU kernels only")
        return None
    try:
        return Kernels(_build(compiler))
    except (OSError, RuntimeError) as exc:
        logger.warning("native CPU kernels unavailable, using torch's: %s", exc)
        return None
