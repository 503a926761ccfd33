"""Linear layers served from packed weights (GGUF blocks or int8) by the native quantized kernels.

Each packed layer keeps its Transformers module and fp32 weight as they are (training, weight updates and
`close()` see the model unchanged); the engine's forward passes route the layer's calls to the packed kernel
for every call of up to 64 rows when packed weights were asked for (`gguf`, `int8`); under `auto`, for the batch
sizes where the packed kernel measured faster than the fp32 path. Other calls take the fp32 path (the forward
the fast-linear router installed, on the resident fp32 weight). Rows above the last bucket always take
the fp32 path: there the matmul is bound by arithmetic, which torch's blocked GEMM does better than a kernel
that decodes every weight once per eight rows, and the fp32 weight is at hand without a dequantized copy.
The timings are taken once per shape, format, kernel variant and thread count, on weights out of cache as a
decode step streams them, and kept in `$VRIKSHA_CACHE/quant_linear.json`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vriksha.engine.installation import ModuleInstallation
from vriksha.engine.measured_router import MeasuredRouter, Runner, bucket_index, cold_copies, time_cold
from vriksha.engine.native import Kernels
from vriksha.engine.native.quant import SOURCE, QuantKernels
from vriksha.loading.packed import BLOCK_BYTES, PackedWeight, requantize_int8_, row_bytes

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # rows per call; a call uses the smallest bucket >= its rows


def _random_packed(qtype: str, out_f: int, in_f: int) -> PackedWeight:
    """A packed weight of random codes with normal scales (random fp16 bytes would make denormals and NaNs)."""
    if qtype == "int8":
        data = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8)
        return PackedWeight("int8", data, out_f, in_f, torch.full((out_f,), 0.01))
    data = torch.randint(0, 256, (out_f, row_bytes(qtype, in_f)), dtype=torch.uint8)
    blocks = data.view(out_f, -1, BLOCK_BYTES[qtype])
    half = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    blocks[..., 0:2] = half
    if qtype == "q4_1":
        blocks[..., 2:4] = half
    return PackedWeight(qtype, data, out_f, in_f)


def measure(
    qtype: str, out_f: int, in_f: int, kernels: QuantKernels, fp32: Kernels | None
) -> dict[str, list[float]]:
    """Seconds per call at each bucket: the packed kernel and the faster of `F.linear` and the native fp32
    kernel, each on weights out of cache."""
    packed_copies = cold_copies(row_bytes(qtype, in_f) * out_f)
    fp32_copies = cold_copies(4 * out_f * in_f)
    packed = [_random_packed(qtype, out_f, in_f) for _ in range(packed_copies)]
    weights = [torch.randn(out_f, in_f) for _ in range(fp32_copies)]
    times: dict[str, list[float]] = {"packed": [], "fp32": []}
    with torch.inference_mode():
        for rows in BUCKETS:
            x = torch.randn(rows, in_f)
            times["packed"].append(
                time_cold(lambda c, x=x: kernels.linear(x, packed[c]), packed_copies, 0.02)
            )
            t = time_cold(lambda c, x=x: F.linear(x, weights[c]), fp32_copies, 0.02)
            if fp32 is not None:
                t = min(t, time_cold(lambda c, x=x: fp32.linear(x, weights[c]), fp32_copies, 0.02))
            times["fp32"].append(t)
    return times


def _source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


class QuantLinear(MeasuredRouter):
    """The packed layers of one model: measured routes, installed forwards, refresh after weight updates."""

    CACHE_FILE = "quant_linear.json"
    WHAT = "packed linear"

    def __init__(
        self,
        model: nn.Module,
        packed: dict[str, PackedWeight],
        kernels: QuantKernels,
        fp32: Kernels | None = None,
    ) -> None:
        super().__init__()
        self.kernels = kernels
        self.fp32 = fp32
        self.enabled = True
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
                kernels.dequantize(weight, 0, 1)[0], module.weight[0]
            ):
                logger.warning("packed weight %s does not hold its module's values: left out", name)
                continue
            self.layers.append((module, weight))
        self.times: dict[str, dict[str, list[float]]] | None = None  # filled by measure()
        self.installed: dict[nn.Module, tuple[PackedWeight, list[bool]]] = {}  # module: (weight, route)

    def key(self, weight: PackedWeight) -> str:
        return (
            f"v1:{weight.qtype}:{weight.out_features}x{weight.in_features}:{self.kernels.variant}:"
            f"t{torch.get_num_threads()}:{torch.__version__}:{_source_digest()}:"
            f"{'native' if self.fp32 is not None else 'torch'}"
        )

    def measure_one(self, weight: PackedWeight) -> dict[str, list[float]]:
        return measure(weight.qtype, weight.out_features, weight.in_features, self.kernels, self.fp32)

    def valid(self, record: dict[str, list[float]]) -> bool:
        return len(record.get("packed", ())) == len(BUCKETS)

    def measure(self) -> dict[str, dict[str, list[float]]]:
        """Seconds per call of each packed shape at each bucket, packed and fp32 (measured once, cached)."""
        known = self.measured([w for _, w in self.layers])
        self.times = {self.key(w): known[self.key(w)] for _, w in self.layers}
        return self.times

    def step_seconds(self, rows: int = 1) -> tuple[float, float]:
        """(packed, fp32) seconds of all packed layers' calls in one forward of `rows` rows, as measured."""
        i = bucket_index(BUCKETS, rows)
        if i == len(BUCKETS):
            raise ValueError(f"rows must be at most {BUCKETS[-1]}, got {rows}")
        if self.times is None:
            self.measure()
        packed = sum(self.times[self.key(w)]["packed"][i] for _, w in self.layers)
        fp32 = sum(self.times[self.key(w)]["fp32"][i] for _, w in self.layers)
        return packed, fp32

    def formats(self) -> dict[str, int]:
        return dict(Counter(w.qtype for _, w in self.layers))

    def install(self, installation: ModuleInstallation, measured: bool = False) -> None:
        """Replace each packed layer's forward (recorded in `installation`, which puts the originals back).
        `measured`: packed only at the buckets where it measured faster; else at every bucket."""
        for module, weight in self.layers:
            route = [True] * len(BUCKETS)
            if measured:
                t = (self.times or self.measure())[self.key(weight)]
                route = [p < f for p, f in zip(t["packed"], t["fp32"], strict=True)]
            installation.replace_forward(module, self._make_forward(module, weight, route))
            self.installed[module] = (weight, route)

    def packed_for(self, module: nn.Module, rows: int) -> PackedWeight | None:
        """The packed weight a call of `rows` rows on `module` runs on while engaged, or None (fp32 path)."""
        entry = self.installed.get(module)
        i = bucket_index(BUCKETS, rows)
        if not self.enabled or entry is None or i == len(BUCKETS) or not entry[1][i]:
            return None
        return entry[0]

    def routes(self, x: torch.Tensor) -> bool:
        return self.enabled and x.dtype == torch.float32 and super().routes(x)

    def _make_forward(self, module: nn.Linear, weight: PackedWeight, route: list[bool]) -> Callable:
        kernels = self.kernels

        def run(x: torch.Tensor) -> torch.Tensor:
            return kernels.linear(x.contiguous(), weight, module.bias)

        runners: list[Runner | None] = [run if packed else None for packed in route]
        runners.append(None)  # rows above the last bucket take the fp32 path
        return self.routed_forward(module, BUCKETS, runners)

    def refresh(self) -> None:
        """After an in-place weight update: int8 weights are quantized again from the new fp32 values; GGUF
        blocks no longer describe the weights, so their layers go back to the fp32 path."""
        stale = False
        with torch.no_grad():
            for module, weight in self.layers:
                if weight.qtype == "int8":
                    requantize_int8_(weight, module.weight)
                else:
                    stale = True
        if stale and self.enabled:
            logger.warning("weights updated: the GGUF file's packed blocks no longer apply, serving fp32")
            self.enabled = False
