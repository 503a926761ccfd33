"""The engine's native CPU kernels (`kernels.c`, `kernels_bf16.c`, `attention_f32.c`), compiled on first use with the system C compiler.

The sources are compiled once per instruction-set variant (`isa.py`: scalar, AVX2/FMA, AVX-512, AVX-512
BF16), source, compiler and CPU into `$VRIKSHA_CACHE/native/`, and the widest variant the CPU's flags allow
is loaded with ctypes; the library links the OpenMP runtime torch has already loaded, so both share one
thread pool. Without a C compiler, or with `VRIKSHA_NATIVE=0`, `kernels()` returns None and the engine keeps
its torch paths. Every entry point takes float32 or bfloat16 tensors (one dtype per call), on the CPU and
contiguous.
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
from collections.abc import Callable
from pathlib import Path

import torch

from vriksha.artifact_store import announce_first_load, cache_dir
from vriksha.engine.platform.native import isa
from vriksha.profiling.annotate import native_call

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = (HERE / "kernels.c", HERE / "kernels_bf16.c", HERE / "attention_f32.c")
HEADERS = (HERE / "simd.h", HERE / "tiles.h", HERE / "amx.h")
DTYPES = (torch.float32, torch.bfloat16)
_I64, _F32, _PTR, _INT = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def build(
    compiler: str,
    variant: isa.Variant,
    sources: tuple[Path, ...] = SOURCES,
    headers: tuple[Path, ...] = HEADERS,
    name: str = "kernels",
    extra_cflags: tuple[str, ...] = (),
) -> Path:
    """The shared library of `variant`, compiled unless this source, compiler and CPU already have it.

    A variant compiles on any x86 machine whose compiler knows its flags, whether or not the CPU runs it.
    `sources`, `name` and `extra_cflags` build another family of kernels the same way (`quant.py`).
    """
    source = b"".join(p.read_bytes() for p in (*sources, *headers)) + " ".join(extra_cflags).encode()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    cpu = " ".join(sorted(isa.cpu_flags())) or platform.processor()
    key = hashlib.sha256(source + version.encode() + cpu.encode() + platform.machine().encode())
    target = cache_dir() / "native" / f"{name}-{variant.name}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    announce_first_load()
    target.parent.mkdir(parents=True, exist_ok=True)
    base = [compiler, "-O3", *variant.cflags, *extra_cflags, "-shared", "-fPIC", *map(str, sources)]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        errors = ""
        for extra in (["-fopenmp"], []):  # a compiler without OpenMP still gives single-threaded kernels
            done = subprocess.run([*base, *extra, "-o", str(out), "-lm"], capture_output=True, text=True)
            if done.returncode == 0:
                os.replace(out, target)  # atomic: processes building at once all end with one whole file
                return target
            errors = done.stderr
        raise RuntimeError(f"{compiler} could not build the {variant.name} {name}: {errors.strip()[-2000:]}")


_SIGNATURES = {
    "linear": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "decode_attention": [_PTR] * 6 + [_I64] * 6 + [_F32, _I64, _INT],
    "rms_norm": [_PTR] * 4 + [_I64, _I64, _F32, _INT],
    "rope": [_PTR] * 3 + [_I64] * 3 + [_INT],
    "silu_mul": [_PTR] * 3 + [_I64, _INT],
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


class Kernels:
    """Typed entry points of one loaded variant; inputs float32 or bfloat16, on the CPU and contiguous."""

    def __init__(self, path: Path, variant: isa.Variant) -> None:
        lib = ctypes.CDLL(str(path))
        self._fns: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
        for name, argtypes in _SIGNATURES.items():
            for dtype, suffix in _SUFFIX.items():
                fn = getattr(lib, f"{name}_{suffix}")
                fn.argtypes = argtypes
                fn.restype = None
                self._fns[name, dtype] = fn
        self._prefill = {}
        for dtype, suffix in _SUFFIX.items():
            fn = getattr(lib, f"prefill_attention_{suffix}")
            fn.argtypes = [_PTR] * 4 + [_I64, _I64, _PTR] + [_I64] * 4 + [_F32, _INT]
            fn.restype = ctypes.c_int
            self._prefill[dtype] = fn
        self._attention_amx = lib.attention_amx
        self._attention_amx.argtypes = [_INT]
        self._attention_amx.restype = _INT
        self._greedy = lib.greedy_pick_f32
        self._greedy.argtypes = [_PTR, _I64, _I64, _PTR, _PTR, _INT]
        self._greedy.restype = None
        self._lib = lib
        self.path = path
        self.variant = variant

    def _fn(self, name: str, dtype: torch.dtype):
        try:
            return native_call(self._fns[name, dtype], name)
        except KeyError:
            raise TypeError(f"native {name} takes float32 or bfloat16 tensors, got {dtype}") from None

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] @ weight[out, in].T (+ bias): the weight is read in place, once per call."""
        rows, in_f = x.shape
        out_f = weight.shape[0]
        y = torch.empty(rows, out_f, dtype=weight.dtype)
        self._fn("linear", weight.dtype)(
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
        self._fn("rms_norm", x.dtype)(
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
        self._fn("rope", x.dtype)(
            x.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens, heads, dim, torch.get_num_threads()
        )
        return x

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(gate)
        self._fn("silu_mul", gate.dtype)(
            gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), torch.get_num_threads()
        )
        return out

    def decode_attention(
        self,
        q: torch.Tensor,  # [B, H, D], the pool's dtype
        k_pool: torch.Tensor,  # [S, Hkv, D]
        v_pool: torch.Tensor,  # [S, Hkv, Dv]
        slots: torch.Tensor,  # [B, max_len] int64
        lens: torch.Tensor,  # [B] int64
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """Softmax attention of one query per request over its KV slots, read from the pool in place;
        float32 out [B, H, Dv] (sums in float32 for a bf16 pool too)."""
        batch, heads, d = q.shape
        kv_heads, dv = v_pool.shape[1], v_pool.shape[2]
        out = torch.empty(batch, heads, dv, dtype=torch.float32)
        self._fn("decode_attention", k_pool.dtype)(
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

    def greedy_pick(self, logits: torch.Tensor) -> tuple[list[int], list[float]] | None:
        """Per row of float32 logits [rows, vocab]: the argmax (the first of equal values, as torch.argmax) and
        its log-probability under the row's softmax, without a log-softmax tensor; None where a row holds a
        NaN or an infinity at its top (the caller samples those rows the general way)."""
        rows, vocab = logits.shape
        ids = torch.empty(rows, dtype=torch.int64)
        logprobs = torch.empty(rows, dtype=torch.float32)
        native_call(self._greedy, "greedy_pick")(
            logits.data_ptr(), rows, vocab, ids.data_ptr(), logprobs.data_ptr(), torch.get_num_threads()
        )
        picked = ids.tolist()
        return None if min(picked, default=0) < 0 else (picked, logprobs.tolist())

    def prefill_attention(
        self,
        q: torch.Tensor,  # [T, H, D] float32, contiguous
        k_pool: torch.Tensor,  # [S, Hkv, D] float32 or bfloat16
        v_pool: torch.Tensor,  # [S, Hkv, Dv] the same dtype
        slots: torch.Tensor,  # [prefix + T] int64: the chunk's slots, its own K/V (already written) last
        scale: float,
    ) -> torch.Tensor | None:
        """Causal attention of a prompt chunk over the pool in place (token t sees slots [0, prefix + t]),
        float32 out [T, H, Dv]; None where this build has no such kernel for the pool's dtype: a bf16 pool
        needs AVX-512 BF16 and head sizes a multiple of 32 for keys and 64 for values, a float32 pool AVX2/FMA
        and multiples of 8 and 16. The caller then runs SDPA."""
        tokens, heads, d = q.shape
        kv_heads, dv = v_pool.shape[1], v_pool.shape[2]
        fn = self._prefill.get(k_pool.dtype)
        if (
            fn is None
            or q.dtype != torch.float32
            or slots.dtype != torch.int64
            or v_pool.dtype != k_pool.dtype
        ):
            return None
        slots = slots.contiguous()
        out = torch.empty(tokens, heads, dv, dtype=torch.float32)
        pointers = (q, k_pool, v_pool, slots)
        prefix = slots.shape[0] - tokens
        done = native_call(fn, "prefill_attention")(
            *(t.data_ptr() for t in pointers), prefix, tokens, out.data_ptr(), heads, kv_heads, d, dv, scale,
            torch.get_num_threads(),
        )  # fmt: skip
        return out if done == 0 else None

    def attention_amx(self, use: bool | None = None) -> bool:
        """Whether the bf16 pool's attention lanes (shared prefixes in decode, prompt chunks) run on AMX tiles:
        by default wherever the CPU has AMX-BF16 and the OS grants this process the tile state; `use=False`
        keeps them on AVX512-BF16 instructions (`True` restores the default). Process-wide."""
        return bool(self._attention_amx(-1 if use is None else int(use)))


def load_variant(
    variant: str | None,
    build_library: Callable[[str, isa.Variant], Path],
    fallback: str,
    runnable: Callable[[isa.Variant], bool] | None = None,
) -> tuple[Path, isa.Variant] | None:
    """The library `build_library(compiler, variant)` makes for `variant` (default: the widest this CPU runs),
    with the variant; None with VRIKSHA_NATIVE=0, without a C compiler, where this CPU cannot run it, or where
    the build fails (logged, with `fallback`: what is used instead)."""
    if os.environ.get("VRIKSHA_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found (set CC): %s", fallback)
        return None
    chosen = isa.variant(variant) if variant is not None else isa.best_variant()
    if not (runnable or isa.runnable)(chosen):
        logger.warning(
            "native %s build needs CPU flags %s: %s",
            chosen.name,
            ", ".join(isa.missing_flags(chosen)),
            fallback,
        )
        return None
    try:
        return build_library(compiler, chosen), chosen
    except (OSError, RuntimeError) as exc:
        logger.warning("native %s build unavailable (%s): %s", chosen.name, exc, fallback)
        return None


@functools.cache
def kernels(variant: str | None = None) -> Kernels | None:
    """The native kernels of `variant` (default: the widest this CPU runs), built on first call; None where
    they cannot run (the reason is logged once)."""
    loaded = load_variant(variant, build, "the engine uses torch's CPU kernels only")
    return Kernels(*loaded) if loaded else None
