"""Pick the fastest CPU matmul path per linear-layer shape and batch size, measured when the model loads.

On the CPU the same [out x in] linear layer can differ several-fold in time between `F.linear`, a matmul
against a pre-transposed contiguous weight, oneDNN's packed linear and the engine's native bandwidth-bound
kernel (`native/kernels.c`, on the weight in place), depending on the batch size. The engine times each path
for each distinct weight shape at a few batch-size buckets, with the weights out of cache as they are when a
decode step streams the whole model, and routes every call to the winner. The choice applies only while the
router is engaged (the engine's forward passes); training forwards use `F.linear` as usual. The replaced
`forward`s are recorded in the engine's `ModuleInstallation`, which puts the originals back.
Derived weight layouts are rebuilt by `refresh()` after the weights change in place.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import vriksha.device as devices
from vriksha.cache import cache_dir
from vriksha.engine.installation import ModuleInstallation
from vriksha.engine.native import DTYPES, Kernels

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
PATHS = ("linear", "transposed", "mkldnn", "native")
MIN_GAIN = 0.05  # keep a derived weight copy only if it saves at least 5% per bucket on average
COLD_BYTES = 96 << 20  # timing cycles through copies of a weight until they exceed the last-level cache


def _bucket(rows: int) -> int:
    for i, b in enumerate(BUCKETS):
        if rows <= b:
            return i
    return len(BUCKETS) - 1


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
    """Derived weight layouts of one linear layer."""

    def __init__(self, linear: torch.nn.Linear, paths: set[str], native: Kernels | None = None) -> None:
        self.linear = linear
        self.paths = paths
        self.native = native
        self.transposed: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None
        self.refresh()

    def refresh(self) -> None:
        w = self.linear.weight.detach()
        self.transposed = w.t().contiguous() if "transposed" in self.paths else None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None) if "mkldnn" in self.paths else None

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        bias = self.linear.bias
        if path == "transposed":
            out = x @ self.transposed
            return out + bias if bias is not None else out
        if path == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        if path == "native":
            return self.native.linear(x.contiguous(), self.linear.weight, bias)
        return F.linear(x, self.linear.weight, bias)


def _time(
    fn: Callable[[int], torch.Tensor], copies: int, min_seconds: float = 0.05, max_reps: int = 30
) -> float:
    """Best time of `fn(copy)` over repetitions, each on the next copy of the weight."""
    fn(0)
    best = float("inf")
    start = time.perf_counter()
    for _ in range(max_reps):
        copy = (_ + 1) % copies
        t = time.perf_counter()
        fn(copy)
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > min_seconds and _ >= 2:
            break
    return best


def _choose(out_f: int, in_f: int, dtype: torch.dtype, has_bias: bool, native: Kernels | None) -> list[str]:
    """The fastest path per bucket for one shape, timed on random data out of cache.

    At most one derived layout is kept per shape (a second full copy of the weights costs more memory than
    it saves time), and only where it saves at least MIN_GAIN; each bucket picks between `F.linear`, the
    native kernel (no copy) and that derived path.
    """
    derived = ["transposed"] + (["mkldnn"] if _mkldnn_available(dtype) else [])
    free = ["linear"] + (["native"] if native is not None and dtype in DTYPES else [])
    weight_bytes = out_f * in_f * torch.empty((), dtype=dtype).element_size()
    copies = max(1, min(64, COLD_BYTES // max(weight_bytes, 1)))
    layouts = [
        _Layouts(torch.nn.Linear(in_f, out_f, bias=has_bias, dtype=dtype), set(derived), native)
        for _ in range(copies)
    ]
    times: list[dict[str, float]] = []
    with torch.inference_mode():
        for rows in BUCKETS:
            x = torch.randn(rows, in_f, dtype=dtype)
            times.append(
                {p: _time(lambda c, p=p, x=x: layouts[c].run(p, x), copies) for p in [*free, *derived]}
            )

    def best_of(t: dict[str, float], paths: list[str]) -> str:
        return min(paths, key=t.__getitem__)

    def cost(path: str) -> float:  # time relative to each bucket's best, summed over buckets
        return sum(t[best_of(t, [*free, path])] / min(t.values()) for t in times)

    kept = min(derived, key=cost)
    without = sum(t[best_of(t, free)] / min(t.values()) for t in times)
    if without - cost(kept) < MIN_GAIN * len(times):  # a second copy of the weight must earn its memory
        return [best_of(t, free) for t in times]
    return [best_of(t, [*free, kept]) for t in times]


def _profile_key(out_f: int, in_f: int, dtype: torch.dtype, has_bias: bool, native: str) -> str:
    return (
        f"v6:{out_f}x{in_f}:{dtype}:{'b' if has_bias else 'nb'}:t{torch.get_num_threads()}:"
        f"{torch.__version__}:{native}"
    )


class FastLinear:
    """Routes the engine's CPU linear calls of one model to the fastest measured path."""

    def __init__(
        self, model: torch.nn.Module, installation: ModuleInstallation, native: Kernels | None = None
    ) -> None:
        self.layouts: list[_Layouts] = []
        self.native = native
        self.active = False
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if not linears or not devices.is_host(linears[0].weight.device):
            return
        plan = self._plan(linears)
        for linear in linears:
            choice = plan[self._key(linear)]
            if set(choice) == {"linear"}:
                continue
            layouts = _Layouts(linear, set(choice) - {"linear", "native"}, native)
            self.layouts.append(layouts)
            installation.replace_forward(linear, self._make_forward(linear, layouts, choice))

    def _key(self, linear: torch.nn.Linear) -> str:
        return _profile_key(
            linear.out_features,
            linear.in_features,
            linear.weight.dtype,
            linear.bias is not None,
            f"native-{self.native.variant.name}" if self.native is not None else "torch",
        )

    def _plan(self, linears: list[torch.nn.Linear]) -> dict[str, list[str]]:
        path = cache_dir() / "fast_linear.json"
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        changed = False
        for linear in linears:
            key = self._key(linear)
            if key not in known or len(known[key]) != len(BUCKETS):
                known[key] = _choose(
                    linear.out_features,
                    linear.in_features,
                    linear.weight.dtype,
                    linear.bias is not None,
                    self.native,
                )
                logger.info("linear %s: %s", key, dict(zip(BUCKETS, known[key], strict=True)))
                changed = True
        if changed:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(known, indent=1))
                os.replace(tmp, path)
            except OSError as exc:
                logger.warning("could not save the linear-path plan to %s: %s", path, exc)
        return known

    @contextlib.contextmanager
    def engaged(self) -> Iterator[None]:
        """Route the linear calls made inside this block (the engine's forward pass)."""
        previous, self.active = self.active, True
        try:
            yield
        finally:
            self.active = previous

    def _make_forward(self, linear: torch.nn.Linear, layouts: _Layouts, choice: list[str]) -> Callable:
        original = linear.forward
        in_f = linear.in_features

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not self.active or x.requires_grad:
                return original(x)
            rows = x.numel() // in_f
            path = choice[_bucket(rows)]
            if path == "linear":
                return original(x)
            out = layouts.run(path, x.reshape(rows, in_f))
            return out.reshape(*x.shape[:-1], out.shape[-1])

        return forward

    def refresh(self) -> None:
        for layouts in self.layouts:
            layouts.refresh()
