"""The engine's compute dtype. `dtype="auto"` (the default) computes the model's own numbers: float32 on the
CPU (a GGUF file dequantized to float32; a bf16 checkpoint widened, which loses nothing), and on an
accelerator the checkpoint's own dtype. `dtype="fastest"` is the dtype that runs fastest here, measured once on
the model's own weight shapes; it trades exactness for speed (a bf16 engine's logits differ from the model's by
about 1e-2, and with the batch), and so the engine also allows bf16 arithmetic and int8 activations under it
(`fp32_precision.py`, `quantization.py`).

What `fastest` measures:

Whether bf16 beats fp32 depends on the machine far more than on the model: on a CPU with AMX or AVX512-BF16
a bf16 matmul runs several times faster than fp32, on an AVX2-only CPU several times slower (torch converts
element by element). So nothing is assumed: for each distinct linear-layer shape of the model, a decode-like
call (one row, weights out of cache as a decode step streams them) and a prefill-like call (PREFILL_ROWS
rows; the output head only decodes) are timed in every candidate dtype, summed over the layers, and the
candidate with the least time relative to fp32 (the mean of the decode and the prefill ratio) wins, if it is
at least MARGIN faster than every more precise one: fp32 keeps the engine's native fp32 kernels, which a
bare matmul timing does not see. fp16 is a candidate on accelerators and on CPUs with AVX512-FP16/AMX-FP16.

The result is cached in `$VRIKSHA_CACHE/dtype_choice.json`, keyed by the device's name, the CPU's model and
flag set, torch's version, the thread count and the shapes, so each machine measures once (again where it was
timed under load: `vriksha/timing_load.py`). `$VRIKSHA_DTYPE` pins "auto" and "fastest" to one dtype for a
process and its children without measuring.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import vriksha.device as devices
from vriksha import timing_load
from vriksha.cache import announce_first_load, read_json, write_json
from vriksha.cpu_features import cpu_features
from vriksha.errors import ConfigError, VrikshaError

logger = logging.getLogger(__name__)

PRECISION_ORDER = ("float32", "bfloat16", "float16")  # most precise first
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
MARGIN = 0.10  # a less precise dtype must save at least 10% of the time to be chosen
PREFILL_ROWS = 128
COLD_BYTES = (
    64 << 20
)  # decode timing cycles through copies of a weight until they exceed the last-level cache
CACHE_FILE = "dtype_choice.json"
WHAT = "dtype"  # in the timings' warnings and `generate --verbose`
VERSION = 1
ENV_PIN = (
    "VRIKSHA_DTYPE"  # pins "auto" and "fastest" without measuring (a suite written against fp32 references)
)
AUTO, FASTEST = "auto", "fastest"


@dataclass(frozen=True, slots=True)
class LinearShape:
    out_features: int
    in_features: int
    count: int = 1
    prefill: bool = True  # the output head runs on one row per sequence, so it is timed at decode only


def linear_shapes(module: torch.nn.Module) -> list[LinearShape]:
    """The distinct [out x in] linear layers of `module` with how often each occurs (works on meta tensors)."""
    get_head = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    counts: Counter[tuple[int, int, bool]] = Counter()
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            counts[(m.out_features, m.in_features, m is not head)] += 1
    return [LinearShape(o, i, n, p) for (o, i, p), n in sorted(counts.items())]


def candidates(device: torch.device) -> tuple[str, ...]:
    """The dtypes worth timing on `device`."""
    if devices.is_host(device):
        cpu = cpu_features()
        fp16 = cpu.has("avx512_fp16") or cpu.has("amx_fp16")
        return ("float32", "bfloat16", "float16") if fp16 else ("float32", "bfloat16")
    out = ["float32"]
    for name in ("bfloat16", "float16"):
        try:  # an accelerator without bf16 (or fp16) matmuls raises here
            x = torch.ones(8, 8, dtype=getattr(torch, name), device=device)
            (x @ x).sum().item()
            out.append(name)
        except (RuntimeError, NotImplementedError):
            pass
    return tuple(out)


def _best_call(fn: Callable[[int], Any], copies: int, device: torch.device, min_s: float, reps: int) -> float:
    """Least time of one `fn(copy)`, cycling through the copies; at least two timed calls after a warm-up."""
    fn(0)
    devices.synchronize(device)
    best, start = float("inf"), time.perf_counter()
    for i in range(reps):
        t = time.perf_counter()
        fn((i + 1) % copies)
        devices.synchronize(device)
        best = min(best, time.perf_counter() - t)
        if i >= 1 and time.perf_counter() - start > min_s:
            break
    return best


def _shape_times(
    s: LinearShape, dtype: torch.dtype, device: torch.device, min_s: float, reps: int
) -> tuple[float, float]:
    """Seconds of one decode-like and one prefill-like call of this shape (0 where it never prefills)."""
    size = s.out_features * s.in_features * torch.empty((), dtype=dtype).element_size()
    copies = max(1, min(s.count, COLD_BYTES // max(size, 1)))
    weights = [torch.randn(s.out_features, s.in_features, dtype=dtype, device=device) for _ in range(copies)]
    one = torch.randn(1, s.in_features, dtype=dtype, device=device)
    decode = _best_call(lambda c: F.linear(one, weights[c]), copies, device, min_s, reps)
    if not s.prefill:
        return decode, 0.0
    rows = torch.randn(PREFILL_ROWS, s.in_features, dtype=dtype, device=device)
    return decode, _best_call(lambda c: F.linear(rows, weights[0]), 1, device, min_s, reps)


def measure(
    shapes: Sequence[LinearShape],
    device: torch.device,
    dtypes: Sequence[str],
    min_s: float = 0.03,
    reps: int = 8,
) -> dict[str, dict[str, float]]:
    """Estimated seconds of one decode step and one PREFILL_ROWS-token prefill through the linear layers.

    Every shape is timed in two rounds, the dtypes in opposite orders, keeping each one's best: a burst of
    other work on the machine during one dtype's turn (seen: fp32 decode timed 20x slow while a package
    install ran, and fp16 chosen) then has to hit the same dtype twice to skew the choice."""
    best: dict[tuple[str, int], tuple[float, float]] = {}
    with torch.inference_mode():
        for order in (list(dtypes), list(dtypes)[::-1]):
            for name in order:
                for i, s in enumerate(shapes):
                    d, p = _shape_times(s, getattr(torch, name), device, min_s, reps)
                    old = best.get((name, i))
                    best[(name, i)] = (d, p) if old is None else (min(old[0], d), min(old[1], p))
    return {
        name: {
            "decode_s": sum(s.count * best[(name, i)][0] for i, s in enumerate(shapes)),
            "prefill_s": sum(s.count * best[(name, i)][1] for i, s in enumerate(shapes)),
        }
        for name in dtypes
    }


def relative_times(timings: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each dtype's time as a fraction of fp32's: the mean of its decode and its prefill ratio."""
    base = timings["float32"]
    out = {}
    for name, t in timings.items():
        ratios = [t[k] / base[k] for k in ("decode_s", "prefill_s") if base[k] > 0]
        out[name] = sum(ratios) / len(ratios) if ratios else 1.0
    return out


def pick(timings: dict[str, dict[str, float]]) -> str:
    """The fastest measured dtype, where it saves at least MARGIN over every more precise one."""
    rel = relative_times(timings)
    best = "float32"
    for name in PRECISION_ORDER[1:]:
        if name in rel and rel[name] < rel[best] * (1.0 - MARGIN):
            best = name
    return best


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The compute dtype and how it was arrived at (`how`: measured, cached, given, module)."""

    dtype: torch.dtype
    requested: str
    how: str
    device: str
    cpu: dict[str, Any] = field(default_factory=lambda: cpu_features().to_dict())
    timings: dict[str, dict[str, float]] | None = None

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        text = f"dtype {self.name} ({self.requested}: {self.how}"
        if self.timings:
            rel = relative_times(self.timings)
            text += "; time vs fp32: " + ", ".join(f"{SHORT[k]} {v:.2f}" for k, v in rel.items())
        return f"{text}) on {self.device}; CPU flags: {' '.join(self.cpu['flags']) or '-'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.name,
            "requested": self.requested,
            "how": self.how,
            "device": self.device,
            "cpu": self.cpu,
            "timings": self.timings,
        }


def given(
    dtype: torch.dtype | str, device: torch.device, how: str = "given", requested: str | None = None
) -> DtypeChoice:
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    name = str(dtype).removeprefix("torch.")
    return DtypeChoice(dtype, requested or name, how, devices.describe(device))


def _cache_key(shapes: Sequence[LinearShape], device: torch.device, names: Sequence[str]) -> str:
    shape_text = ";".join(
        f"{s.out_features}x{s.in_features}x{s.count}{'p' if s.prefill else 'd'}" for s in shapes
    )
    digest = hashlib.sha256(shape_text.encode()).hexdigest()[:12]
    return (
        f"v{VERSION}|{devices.describe(device)}|{cpu_features().signature}|torch {torch.__version__}|"
        f"t{torch.get_num_threads()}|{','.join(names)}|{digest}"
    )


def _read_cache() -> dict[str, Any]:
    return read_json(CACHE_FILE)


def _write_cache(key: str, record: dict[str, Any]) -> None:
    known = _read_cache()
    known[key] = record
    write_json(CACHE_FILE, known, "the dtype choice")


def choose_dtype(
    shapes: Sequence[LinearShape], device: torch.device | str, refresh: bool = False
) -> DtypeChoice:
    """The measured fastest dtype for these shapes on `device` (from the cache unless `refresh`)."""
    device = torch.device(device)
    names = candidates(device)
    key = _cache_key(shapes, device, names)
    record = None if refresh else _read_cache().get(key)
    how = "cached"
    if not timing_load.usable(WHAT, key, record) or record.get("dtype") not in names:
        announce_first_load()
        start = time.perf_counter()
        watch = timing_load.LoadWatch()
        timings = measure(shapes, device, names)
        record = timing_load.stamped(WHAT, key, {"dtype": pick(timings), "timings": timings}, watch)
        _write_cache(key, record)
        how = "measured"
        logger.info(
            "dtype fastest: measured %s in %.1f s -> %s",
            timings,
            time.perf_counter() - start,
            record["dtype"],
        )
    return DtypeChoice(
        getattr(torch, record["dtype"]), FASTEST, how, devices.describe(device), timings=record["timings"]
    )


def model_shapes(model: str | os.PathLike | None) -> list[LinearShape]:
    """The linear shapes of a model path (None: the embedded default), read from its config on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from vriksha.loading import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(model))
    with torch.device("meta"):
        return linear_shapes(AutoModelForCausalLM.from_config(config))


def pinned(device: torch.device) -> DtypeChoice | None:
    """What `$VRIKSHA_DTYPE` (float32, bfloat16, float16) pins "auto" to in this process and its children."""
    name = os.environ.get(ENV_PIN, "").strip()
    if not name:
        return None
    if name not in PRECISION_ORDER:
        raise ConfigError(f"{ENV_PIN}={name!r}: set it to one of {', '.join(PRECISION_ORDER)}, or unset it")
    return given(name, device, how=f"pinned by {ENV_PIN}", requested=AUTO)


def faithful(model: str | os.PathLike | None, device: torch.device) -> DtypeChoice:
    """`dtype="auto"`: float32 on the CPU; on an accelerator the checkpoint's dtype where it is a float type
    the device computes (float32 for a GGUF file, whose blocks dequantize to float32)."""
    if devices.is_host(device):
        return given("float32", device, how="the model's own numbers in float32", requested=AUTO)
    stored = _checkpoint_dtype(model)
    if stored in ("bfloat16", "float16") and stored in candidates(device):
        return given(stored, device, how="the checkpoint's dtype", requested=AUTO)
    return given("float32", device, how="the model's own numbers in float32", requested=AUTO)


def _checkpoint_dtype(model: str | os.PathLike | None) -> str | None:
    """The dtype a Transformers checkpoint declares (`dtype` or `torch_dtype` in its config), or None."""
    from transformers import AutoConfig

    from vriksha.loading import resolve_model_path

    if model is None or str(model).endswith(".gguf"):
        return None  # GGUF blocks dequantize to float32
    try:
        config = AutoConfig.from_pretrained(resolve_model_path(model))
    except Exception:  # an unreadable config fails the load itself, with the loader's message
        return None
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(stored).removeprefix("torch.") if stored is not None else None


def resolve(requested: str, model: str | os.PathLike | None, device: torch.device) -> DtypeChoice:
    """The engine's dtype for `requested` ("auto", "fastest" or a dtype name) and a model path."""
    if requested not in (AUTO, FASTEST):
        return given(requested, device)
    pin = pinned(device)
    if pin is not None:
        return DtypeChoice(pin.dtype, requested, pin.how, pin.device)
    if requested == AUTO:
        return faithful(model, device)
    try:
        shapes = model_shapes(model)
    except VrikshaError:
        raise
    except Exception as exc:  # a config Transformers cannot build on the meta device: load as before
        logger.warning("dtype fastest: could not read the model's layer shapes (%s); using float32", exc)
        return given("float32", device, how="shapes unreadable", requested=FASTEST)
    return choose_dtype(shapes, device)
