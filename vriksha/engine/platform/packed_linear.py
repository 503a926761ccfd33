"""Linear layers served from packed weights (GGUF blocks or int8) by the native quantized kernels.

Each packed layer keeps its Transformers module and dense weight (fp32 or bf16, the engine's dtype) as they are
(training, weight updates and `close()` see the model unchanged); the engine's forward passes route the
layer's calls to the packed kernel for every call of up to 1024 rows (a step's token budget) when packed weights were
asked for (`gguf`, `int8`); under `auto`, for the batch sizes where the packed kernel measured faster than the
dense path. Other calls take the dense path (the forward the dense linear paths installed, on the resident
weight), as do rows above the last bucket. Each bucket runs the packed code path that measured fastest there:
the tiled integer path reads 4-bit weights at decode and, on AVX-512 VNNI, outruns an fp32 GEMM on prefill
chunks too; where bf16 matmuls are faster still (AMX, AVX512-BF16), a bf16 engine decodes from the 4-bit
blocks and prefills on bf16 matmuls, from one model. Where bf16 arithmetic is allowed (a bf16 model, or an
fp32 one under `fp32_precision` bf16), the AMX path decodes the same tiled copy to bf16 tiles: from 16 rows
up it outruns the integer path (2-3x at 32 to 64 rows), which keeps the smaller batches.
The timings are taken once per shape, format, dtype, kernel variant and thread count, on weights out of cache
as a decode step streams them, and kept in `$VRIKSHA_CACHE/quant_linear.json`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vriksha.engine.platform.fp32_precision import bf16_linear
from vriksha.engine.platform.linear_path_choice import (
    LinearPathChooser,
    Runner,
    bucket_index,
    cold_copies,
    extrapolated,
    retime_inversions,
    time_buckets_until_slow,
    time_cold,
    timed_buckets,
)
from vriksha.engine.platform.module_installation import ModuleInstallation
from vriksha.engine.platform.native import Kernels
from vriksha.engine.platform.native.quant import (
    BF16_PATHS,
    FLOAT_PATHS,
    HEADERS,
    INT8_PATHS,
    SOURCE,
    TILED_KINDS,
    QuantKernels,
)
from vriksha.loading.packed import BLOCK_BYTES, PackedWeight, requantize_int8_, row_bytes

logger = logging.getLogger(__name__)

# rows per call: a call uses the smallest bucket >= its rows
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# above it the float packed paths are not timed (they decode each weight once per 8 rows)
FLOAT_PATH_ROWS = 64
# the byte offsets of each block's fp16 fields (scales and mins)
HALVES = {"q6_k": (208,)} | {q: (0, 2) for q in ("q4_1", "q5_1", "q4_k", "q5_k")}
# the dense paths timed beside the packed ones
DENSE_TORCH, DENSE_NATIVE, DENSE_BF16 = "dense:torch", "dense:native", "dense:bf16"
DENSE_PATHS = (DENSE_TORCH, DENSE_NATIVE, DENSE_BF16)


def _random_packed(qtype: str, out_f: int, in_f: int) -> PackedWeight:
    """A packed weight of random codes with normal scales (random fp16 bytes would make denormals and NaNs)."""
    if qtype == "int8":
        data = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8)
        return PackedWeight("int8", data, out_f, in_f, torch.full((out_f,), 0.01))
    data = torch.randint(0, 256, (out_f, row_bytes(qtype, in_f)), dtype=torch.uint8)
    blocks = data.view(out_f, -1, BLOCK_BYTES[qtype])
    half = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    for at in HALVES.get(qtype, (0,)):
        blocks[..., at : at + 2] = half
    return PackedWeight(qtype, data, out_f, in_f)


ACTIVATIONS = (
    "float32",
    "int16",
    "int8",
)  # the least precise activations a chooser may time, most precise first


def candidate_paths(
    kernels: QuantKernels, qtype: str, bf16: bool = False, activations: str = "float32"
) -> list[str]:
    """The packed code paths worth timing for `qtype`: the widest float one (the dequantized model's
    numbers), with `activations` int16 or int8 the widest integer one with int16 activations (they win at one
    or two rows, the float ones where more rows share each decoded weight), with `bf16` (bf16 arithmetic
    allowed) the bf16 ones (AMX: from 16 rows up), and with `activations` int8 the widest int8 one."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    floats = [p for p in kernels.paths if p in FLOAT_PATHS]
    tiled = qtype in TILED_KINDS  # the others run their float path on every code path
    rounded = activations != "float32" and tiled
    ints = [p for p in kernels.paths if p not in FLOAT_PATHS + BF16_PATHS + INT8_PATHS] if rounded else []
    bf16s = [p for p in kernels.paths if p in BF16_PATHS] if bf16 and tiled else []
    int8s = [p for p in kernels.paths if p in INT8_PATHS] if activations == "int8" and tiled else []
    return floats[-1:] + ints[-1:] + bf16s + int8s[-1:]


def measure(
    qtype: str,
    out_f: int,
    in_f: int,
    kernels: QuantKernels,
    dense: Kernels | None,
    dtype: torch.dtype = torch.float32,
    bf16: bool = False,
    activations: str = "float32",
) -> dict[str, list]:
    """Per bucket, with `dtype` activations, each on weights out of cache: the seconds of the fastest packed
    code path (`packed`) and its name (`path`), and of the dense path (`dense`: the fastest of `F.linear`,
    the native linear kernel `dense` and, with `bf16` in an fp32 model, `F.linear` in bf16 arithmetic, the
    paths the dense linear layers choose among; `dense_native`: the fastest without bf16 arithmetic, what a
    native decode step has in place of a packed kernel). `activations`: the least precise activations the
    packed paths timed may use (`candidate_paths`). Buckets above MAX_TIMED_MACS are extrapolated."""
    packed_copies = cold_copies(row_bytes(qtype, in_f) * out_f)
    dense_copies = cold_copies(torch.empty((), dtype=dtype).element_size() * out_f * in_f)
    packed = [_random_packed(qtype, out_f, in_f) for _ in range(packed_copies)]
    weights = [torch.randn(out_f, in_f, dtype=dtype) for _ in range(dense_copies)]
    allowed = bf16 or dtype == torch.bfloat16  # a bf16 model's activations are bf16 already
    paths = [p for p in candidate_paths(kernels, qtype, allowed, activations) if kernels.runs(packed[0], p)]
    for path in paths:  # a tiled path's copies are made before timing, as install() makes them
        for weight in packed:
            kernels.pointer(weight, path)

    def time_bucket(i: int) -> dict[str, float]:
        rows = BUCKETS[i]
        x = torch.randn(rows, in_f, dtype=dtype)
        timed = [p for p in paths if rows <= FLOAT_PATH_ROWS or p not in FLOAT_PATHS] or paths
        t = {
            path: time_cold(lambda c, x=x, p=path: kernels.linear(x, packed[c], path=p), packed_copies, 0.02)
            for path in timed
        }
        t[DENSE_TORCH] = time_cold(lambda c, x=x: F.linear(x, weights[c]), dense_copies, 0.02)
        if dense is not None:
            t[DENSE_NATIVE] = time_cold(lambda c, x=x: dense.linear(x, weights[c]), dense_copies, 0.02)
        if bf16 and dtype == torch.float32:
            t[DENSE_BF16] = time_cold(lambda c, x=x: bf16_linear(x, weights[c]), dense_copies, 0.02)
        return t

    with torch.inference_mode():
        by_bucket = time_buckets_until_slow(time_bucket, BUCKETS, timed_buckets(BUCKETS, out_f * in_f))
        retime_inversions(by_bucket, time_bucket)
    times: dict[str, list] = {"packed": [], "path": [], "dense": [], "dense_native": []}
    for t in extrapolated(by_bucket, BUCKETS):
        packed_paths = [p for p in t if p not in DENSE_PATHS]
        fastest = min(packed_paths, key=t.__getitem__)
        times["packed"].append(t[fastest])
        times["path"].append(fastest)
        native = min(t[p] for p in (DENSE_TORCH, DENSE_NATIVE) if p in t)
        times["dense_native"].append(native)
        times["dense"].append(min(native, t.get(DENSE_BF16, native)))
    return times


def source_digest() -> str:
    source = b"".join(p.read_bytes() for p in (SOURCE, *HEADERS))
    return hashlib.sha256(source).hexdigest()[:12]


class PackedShape(NamedTuple):
    qtype: str
    out_features: int
    in_features: int


def shape_of(weight: PackedWeight) -> PackedShape:
    return PackedShape(weight.qtype, weight.out_features, weight.in_features)


class PackedTimings(LinearPathChooser):
    """The measured seconds per call of packed shapes at every bucket, packed and dense, for one kernel build,
    dtype and dense path: measured once per machine, kept in `$VRIKSHA_CACHE/quant_linear.json`. Shared by
    the layers of a loaded model (`PackedLinear`) and by `dtype="auto"`, which weighs packed decode steps
    before a model is loaded."""

    CACHE_FILE = "quant_linear.json"
    WHAT = "packed linear"

    def __init__(
        self,
        kernels: QuantKernels,
        dense: Kernels | None,
        dtype: torch.dtype,
        bf16: bool = False,
        activations: str = "float32",
    ) -> None:
        """`bf16`: the dense path of an fp32 model includes `F.linear` in bf16 arithmetic; `activations`: the
        least precise activations the packed paths timed may use (`candidate_paths`)."""
        super().__init__()
        self.kernels, self.dense, self.dtype = kernels, dense, dtype
        self.bf16 = bf16 and dtype == torch.float32
        self.activations = activations

    def key(self, shape: PackedShape) -> str:
        return (
            f"v6:{shape.qtype}:{shape.out_features}x{shape.in_features}:{self.kernels.variant}:"
            f"{self.dtype}:t{torch.get_num_threads()}:{torch.__version__}:{source_digest()}:"
            f"{'native' if self.dense is not None else 'torch'}{':bf16' if self.bf16 else ''}"
            f":{self.activations}"
        )

    def measure_one(self, shape: PackedShape) -> dict[str, list]:
        return measure(*shape, self.kernels, self.dense, self.dtype, self.bf16, self.activations)

    def valid(self, record: dict[str, list]) -> bool:
        keys = ("packed", "path", "dense", "dense_native")
        return all(len(record.get(k, ())) == len(BUCKETS) for k in keys) and all(
            p in self.kernels.paths for p in record["path"]
        )

    def step_seconds(self, shapes: Sequence[PackedShape], rows: int = 1) -> tuple[float, float]:
        """(packed, dense) seconds of one call of each of `shapes` with `rows` rows (repeats counted)."""
        i = bucket_index(BUCKETS, rows)
        if i == len(BUCKETS):
            raise ValueError(f"rows must be at most {BUCKETS[-1]}, got {rows}")
        known = self.measured(sorted(set(shapes)))
        records = [known[self.key(s)] for s in shapes]
        return sum(r["packed"][i] for r in records), sum(r["dense"][i] for r in records)


class PackedLinear(LinearPathChooser):
    """The packed layers of one model: measured routes, installed forwards, refresh after weight updates."""

    def __init__(
        self,
        model: nn.Module,
        packed: dict[str, PackedWeight],
        kernels: QuantKernels,
        dense: Kernels | None = None,
        bf16: bool = False,
        activations: str = "float32",
    ) -> None:
        """`dense`: the native linear kernels of the model's dtype, timed beside `F.linear` as the dense path;
        `bf16`: so is `F.linear` in bf16 arithmetic (an fp32 model whose dense linear paths may take it);
        `activations`: the least precise activations the packed paths timed may use (`candidate_paths`)."""
        super().__init__()
        self.kernels = kernels
        self.dense = dense
        self.enabled = True
        self.dtype = next(model.parameters()).dtype
        if self.dtype not in kernels.DTYPES:
            raise ValueError(
                f"packed kernels take float32 or bfloat16 activations, the model is {self.dtype}"
            )
        self.timings = PackedTimings(kernels, dense, self.dtype, bf16, activations)
        modules = dict(model.named_modules())
        self.layers: list[tuple[nn.Linear, PackedWeight]] = []
        for name, weight in packed.items():
            module = modules.get(name)
            if not isinstance(module, nn.Linear):
                logger.warning("packed weight %s has no linear module of that name: left out", name)
                continue
            if (module.out_features, module.in_features) != (weight.out_features, weight.in_features):
                logger.warning("packed weight %s does not match its module's shape: left out", name)
                continue
            if weight.qtype != "int8" and not torch.equal(
                kernels.dequantize(weight, 0, 1)[0].to(module.weight.dtype), module.weight[0]
            ):
                logger.warning("packed weight %s does not hold its module's values: left out", name)
                continue
            self.layers.append((module, weight))
        self.times: dict[str, dict[str, list]] | None = None  # filled by measure()
        # module: (weight, the packed code path per bucket, None where the call takes the dense path; the same
        # for a native decode step, whose dense path is the native fp32 kernel)
        self.installed: dict[nn.Module, tuple[PackedWeight, list[str | None], list[str | None]]] = {}

    def key(self, weight: PackedWeight) -> str:
        return self.timings.key(shape_of(weight))

    def measure(self) -> dict[str, dict[str, list]]:
        """Seconds per call of each packed shape at each bucket, packed and dense (measured once, cached)."""
        known = self.timings.measured(sorted({shape_of(w) for _, w in self.layers}))
        self.times = {self.key(w): known[self.key(w)] for _, w in self.layers}
        return self.times

    def step_seconds(self, rows: int = 1) -> tuple[float, float]:
        """(packed, dense) seconds of all packed layers' calls in one forward of `rows` rows, as measured."""
        return self.timings.step_seconds([shape_of(w) for _, w in self.layers], rows)

    def formats(self) -> dict[str, int]:
        return dict(Counter(w.qtype for _, w in self.layers))

    def install(self, installation: ModuleInstallation, measured: bool = False) -> None:
        """Replace each packed layer's forward (recorded in `installation`, which puts the originals back),
        each bucket on its fastest packed code path. `measured`: packed only at the buckets where that
        measured faster than the dense path; else at every bucket."""
        times = self.times or self.measure()
        for module, weight in self.layers:
            t = times[self.key(weight)]
            route, native_route = (
                [
                    path if not measured or p < d else None
                    for path, p, d in zip(t["path"], t["packed"], t[dense], strict=True)
                ]
                for dense in ("dense", "dense_native")
            )
            for path in set(route + native_route) - {None}:
                self.kernels.pointer(weight, path)  # a tiled path's copy, made once here
            installation.replace_forward(module, self._make_forward(module, weight, route))
            self.installed[module] = (weight, route, native_route)

    def paths(self) -> set[str]:
        """The packed code paths the installed routes run (the engine's forwards and native decode steps)."""
        return {p for _, route, native in self.installed.values() for p in route + native} - {None}

    def activations(self) -> str:
        """The least precise activations an installed route uses: int8, bf16, int16 or float32."""
        paths = self.paths()
        if paths & set(INT8_PATHS):
            return "int8"
        if paths & set(BF16_PATHS):
            return "bf16"
        return "float32" if paths <= set(FLOAT_PATHS) else "int16"

    def packed_for(
        self, module: nn.Module, rows: int, native: bool = False
    ) -> tuple[PackedWeight, str] | None:
        """The packed weight and code path a call of `rows` rows on `module` runs on while engaged, or None
        (dense path); `native`: in a native decode step, whose dense path is the native fp32 kernel."""
        entry = self.installed.get(module)
        i = bucket_index(BUCKETS, rows)
        if not self.enabled or entry is None or i == len(BUCKETS):
            return None
        path = entry[2 if native else 1][i]
        return None if path is None else (entry[0], path)

    def always_packed(self) -> set[nn.Module]:
        """The layers whose engine calls of every bucket run packed (their dense path only above the last)."""
        if not self.enabled:
            return set()
        return {module for module, (_, route, _) in self.installed.items() if None not in route}

    def routes(self, x: torch.Tensor) -> bool:
        return self.enabled and x.dtype == self.dtype and super().routes(x)

    def _make_forward(self, module: nn.Linear, weight: PackedWeight, route: list[str | None]) -> Callable:
        kernels = self.kernels

        def runner(path: str) -> Runner:
            def run(x: torch.Tensor) -> torch.Tensor:
                return kernels.linear(x.contiguous(), weight, module.bias, path=path)

            return run

        runners: list[Runner | None] = [runner(path) if path else None for path in route]
        runners.append(None)  # rows above the last bucket take the dense path
        return self.routed_forward(module, BUCKETS, runners)

    def refresh(self) -> None:
        """After an in-place weight update: int8 weights are quantized again from the new values; GGUF
        blocks no longer describe the weights, so their layers go back to the dense path."""
        stale = False
        with torch.no_grad():
            for module, weight in self.layers:
                if weight.qtype == "int8":
                    requantize_int8_(weight, module.weight)
                else:
                    stale = True
        if stale and self.enabled:
            logger.warning(
                "weights updated: the GGUF file's packed blocks no longer apply, serving the %s weights",
                str(self.dtype).removeprefix("torch."),
            )
            self.enabled = False
