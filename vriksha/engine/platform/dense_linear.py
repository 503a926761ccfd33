"""Pick the fastest CPU matmul path per linear-layer shape and batch size, measured when the model loads.

On the CPU the same [out x in] linear layer can differ several-fold in time between `F.linear`, a matmul
against a pre-transposed contiguous weight, oneDNN's packed linear and the engine's native bandwidth-bound
kernel (`native/kernels.c`, on the weight in place), depending on the batch size. The engine times each path
for each distinct weight shape at a few batch-size buckets, with the weights out of cache as they are when a
decode step streams the whole model, and routes every call to the winner. The choice applies only while the
chooser is engaged (the engine's forward passes); training forwards use `F.linear` as usual. The replaced
`forward`s are recorded in the engine's `ModuleInstallation`, which puts the originals back.
Derived weight layouts are rebuilt by `refresh()` after the weights change in place. Where the engine allows it
(`platform/fp32_precision.py`), fp32 layers also time `F.linear` in bf16 arithmetic (no weight copy) and take it at
the batch sizes where it measured faster.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection

import torch
import torch.nn.functional as F

import vriksha.device as devices
from vriksha.engine.platform.fp32_precision import bf16_linear
from vriksha.engine.platform.linear_path_choice import (
    LinearPathChooser,
    Runner,
    cold_copies,
    extrapolated,
    retime_inversions,
    time_buckets_until_slow,
    time_cold,
    timed_buckets,
)
from vriksha.engine.platform.module_installation import ModuleInstallation
from vriksha.engine.platform.native import DTYPES, Kernels

logger = logging.getLogger(__name__)

BUCKETS = (
    1,
    2,
    4,
    8,
    16,
    64,
    256,
    1024,
)  # representative batch sizes; a call uses the smallest bucket >= its rows
PATHS = ("linear", "transposed", "mkldnn", "native", "bf16")
MIN_GAIN = 0.05  # keep a derived weight copy only if it saves at least 5% per bucket on average


@functools.cache
def _mkldnn_available(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of this dtype here (bf16 needs AVX-512 or AVX-NE-CONVERT on the CPU)."""
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), None)
    except RuntimeError:
        return False
    return True


class _Layouts:
    """Derived weight layouts of one linear layer, each made on its first call: a layer whose calls all take
    another route (a packed layer's quantized kernel) never holds a second copy of its weight."""

    def __init__(self, linear: torch.nn.Linear, paths: set[str], native: Kernels | None = None) -> None:
        self.linear = linear
        self.paths = paths
        self.native = native
        self.transposed: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None

    def refresh(self) -> None:
        """Forget the derived copies (the weight changed): the next call of their path makes them again."""
        self.transposed = self.packed = None

    def build(self) -> None:
        # normal tensors even when the first call comes under inference mode
        with torch.inference_mode(False), torch.no_grad():
            w = self.linear.weight.detach()
            if "transposed" in self.paths and self.transposed is None:
                self.transposed = w.t().contiguous()
            if "mkldnn" in self.paths and self.packed is None:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.transposed, self.packed) if t is not None)

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        bias = self.linear.bias
        if path == "transposed":
            if self.transposed is None:
                self.build()
            out = x @ self.transposed
            return out + bias if bias is not None else out
        if path == "mkldnn":
            if self.packed is None:
                self.build()
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        if path == "native":
            return self.native.linear(x.contiguous(), self.linear.weight, bias)
        if path == "bf16":
            return bf16_linear(x, self.linear.weight, bias)
        return F.linear(x, self.linear.weight, bias)


def _choose(
    out_f: int,
    in_f: int,
    dtype: torch.dtype,
    has_bias: bool,
    native: Kernels | None,
    bf16: bool = False,
    head: bool = False,
) -> list[str]:
    """The fastest path per bucket for one shape, timed on random data out of cache. `head`: the output
    head, which computes only the rows that sample (and prompt log-probs): its buckets above MAX_TIMED_MACS
    are extrapolated rather than timed (seconds a call where bf16 arithmetic is emulated).

    At most one derived layout is kept per shape (a second full copy of the weights costs more memory than
    it saves time), and only where it saves at least MIN_GAIN; each bucket picks between `F.linear`, the
    native kernel and, with `bf16` on an fp32 layer, `F.linear` in bf16 arithmetic (none copies the weight)
    and that derived path.
    """
    derived = ["transposed"] + (["mkldnn"] if _mkldnn_available(dtype) else [])
    free = ["linear"] + (["native"] if native is not None and dtype in DTYPES else [])
    if bf16 and dtype == torch.float32:
        free.append("bf16")
    weight_bytes = out_f * in_f * torch.empty((), dtype=dtype).element_size()
    copies = cold_copies(weight_bytes)
    layouts = [
        _Layouts(torch.nn.Linear(in_f, out_f, bias=has_bias, dtype=dtype), set(derived), native)
        for _ in range(copies)
    ]
    for layout in layouts:
        layout.build()

    def time_bucket(i: int) -> dict[str, float]:
        x = torch.randn(BUCKETS[i], in_f, dtype=dtype)
        return {p: time_cold(lambda c, p=p, x=x: layouts[c].run(p, x), copies) for p in [*free, *derived]}

    with torch.inference_mode():
        count = timed_buckets(BUCKETS, out_f * in_f) if head else len(BUCKETS)
        times = time_buckets_until_slow(time_bucket, BUCKETS, count)
        retime_inversions(times, time_bucket)
    times = extrapolated(times, BUCKETS)

    def best_of(t: dict[str, float], paths: list[str]) -> str:
        return min(paths, key=t.__getitem__)

    def cost(path: str) -> float:  # time relative to each bucket's best, summed over buckets
        return sum(t[best_of(t, [*free, path])] / min(t.values()) for t in times)

    kept = min(derived, key=cost)
    without = sum(t[best_of(t, free)] / min(t.values()) for t in times)
    if without - cost(kept) < MIN_GAIN * len(times):  # a second copy of the weight must earn its memory
        return [best_of(t, free) for t in times]
    return [best_of(t, [*free, kept]) for t in times]


def _profile_key(out_f: int, in_f: int, dtype: torch.dtype, has_bias: bool, native: str, bf16: bool) -> str:
    return (
        f"v8:{out_f}x{in_f}:{dtype}:{'b' if has_bias else 'nb'}:t{torch.get_num_threads()}:"
        f"{torch.__version__}:{native}{':bf16' if bf16 else ''}"
    )


class DenseLinear(LinearPathChooser):
    """Routes the engine's CPU linear calls of one model to the fastest measured path."""

    CACHE_FILE = "fast_linear.json"
    WHAT = "linear-path plan"

    def __init__(
        self,
        model: torch.nn.Module,
        installation: ModuleInstallation,
        native: Kernels | None = None,
        bf16: bool = False,
    ) -> None:
        """`bf16`: fp32 layers may take `F.linear` in bf16 arithmetic where it measures faster."""
        super().__init__()
        self.layouts: list[_Layouts] = []
        self.native = native
        self.bf16 = bf16
        self.plan: dict[str, list[str]] = {}
        head = getattr(model, "get_output_embeddings", lambda: None)()
        self.head = head if isinstance(head, torch.nn.Linear) else None
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if not linears or not devices.is_host(linears[0].weight.device):
            return
        plan = self.measured(linears)
        for linear in linears:
            choice = plan[self.key(linear)]
            self.plan[self.key(linear)] = choice
            if set(choice) == {"linear"}:
                continue
            layouts = _Layouts(linear, set(choice) - {"linear", "native"}, native)
            self.layouts.append(layouts)
            runners: list[Runner | None] = [
                None if path == "linear" else functools.partial(layouts.run, path) for path in choice
            ]
            runners.append(runners[-1])  # rows above the last bucket take its path
            installation.replace_forward(linear, self.routed_forward(linear, BUCKETS, runners))

    def key(self, linear: torch.nn.Linear) -> str:
        return _profile_key(
            linear.out_features,
            linear.in_features,
            linear.weight.dtype,
            linear.bias is not None,
            f"native-{self.native.variant.name}" if self.native is not None else "torch",
            self.bf16 and linear.weight.dtype == torch.float32,
        )

    def measure_one(self, linear: torch.nn.Linear) -> list[str]:
        return _choose(
            linear.out_features,
            linear.in_features,
            linear.weight.dtype,
            linear.bias is not None,
            self.native,
            self.bf16,
            head=linear is self.head,
        )

    def valid(self, record: list[str]) -> bool:
        return len(record) == len(BUCKETS) and all(path in PATHS for path in record)

    def bf16_buckets(self) -> list[int]:
        """The batch-size buckets at which some layer runs in bf16 arithmetic (for logs and --verbose)."""
        return [b for i, b in enumerate(BUCKETS) if any(c[i] == "bf16" for c in self.plan.values())]

    def describe(self, record: list[str]) -> dict[int, str]:
        return dict(zip(BUCKETS, record, strict=True))

    def build_layouts(self, skip: Collection[torch.nn.Module] = ()) -> int:
        """Make the derived weight copies now (else each is made on its layer's first call of its path),
        except for the layers in `skip` (those the packed linear layers serve at every bucket); returns their bytes."""
        for layouts in self.layouts:
            if layouts.linear not in skip:
                layouts.build()
        return sum(layouts.nbytes() for layouts in self.layouts)

    def refresh(self) -> None:
        for layouts in self.layouts:
            layouts.refresh()
