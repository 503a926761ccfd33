"""Pick the fastest CPU matmul path per linear-layer shape and batch size, measured when the model loads.

On the CPU the same [out x in] linear layer can differ several-fold in time between `F.linear`, a matmul
against a pre-transposed contiguous weight, and oneDNN's packed linear, depending on the batch size. The
engine times each path for each distinct weight shape at a few batch-size buckets and routes every call to
the winner. The choice applies only inside engine forward passes; training forwards use `F.linear` as usual.
Derived weight layouts are rebuilt by `refresh()` after the weights change in place.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vriksha.models.loader import cache_dir

logger = logging.getLogger(__name__)

BUCKETS = (1, 4, 16, 64, 256, 1024)  # representative batch sizes; a call uses the smallest bucket >= its rows
PATHS = ("linear", "transposed", "mkldnn")
_active = False


def set_active(active: bool) -> bool:
    global _active
    previous, _active = _active, active
    return previous


def _bucket(rows: int) -> int:
    for i, b in enumerate(BUCKETS):
        if rows <= b:
            return i
    return len(BUCKETS) - 1


def _mkldnn_available(dtype: torch.dtype) -> bool:
    return torch.backends.mkldnn.is_available() and dtype in (torch.float32, torch.bfloat16)


class _Layouts:
    """Derived weight layouts of one linear layer."""

    def __init__(self, linear: torch.nn.Linear, paths: set[str]) -> None:
        self.linear = linear
        self.paths = paths
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
        return F.linear(x, self.linear.weight, bias)


def _time(fn: Callable[[], torch.Tensor], min_seconds: float = 0.05, max_reps: int = 30) -> float:
    fn()
    best = float("inf")
    start = time.perf_counter()
    for _ in range(max_reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > min_seconds and _ >= 2:
            break
    return best


def _choose(out_f: int, in_f: int, dtype: torch.dtype, has_bias: bool) -> list[str]:
    """The fastest path per bucket for one shape, timed on random data.

    At most one derived layout is kept per shape (a second full copy of the weights costs more memory than
    it saves time), so each bucket picks between `F.linear` and the derived path that helps most overall.
    """
    weight = torch.nn.Linear(in_f, out_f, bias=has_bias, dtype=dtype)
    derived = ["transposed"] + (["mkldnn"] if _mkldnn_available(dtype) else [])
    layouts = _Layouts(weight, set(derived))
    times: list[dict[str, float]] = []
    with torch.inference_mode():
        for rows in BUCKETS:
            x = torch.randn(rows, in_f, dtype=dtype)
            times.append({p: _time(lambda p=p, x=x: layouts.run(p, x)) for p in ["linear", *derived]})

    def cost(path: str) -> float:  # time relative to each bucket's best, summed over buckets
        return sum(min(t["linear"], t[path]) / min(t.values()) for t in times)

    best = min(derived, key=cost)
    return [best if t[best] < t["linear"] else "linear" for t in times]


def _profile_key(out_f: int, in_f: int, dtype: torch.dtype, has_bias: bool) -> str:
    return f"v3:{out_f}x{in_f}:{dtype}:{'b' if has_bias else 'nb'}:t{torch.get_num_threads()}:{torch.__version__}"


class FastLinear:
    """Routes the engine's CPU linear calls of one model to the fastest measured path."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layouts: list[_Layouts] = []
        self._originals: list[tuple[torch.nn.Linear, Callable]] = []
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if not linears or linears[0].weight.device.type != "cpu":
            return
        plan = self._plan(linears)
        for linear in linears:
            choice = plan[_profile_key(linear.out_features, linear.in_features, linear.weight.dtype,
                                       linear.bias is not None)]
            if set(choice) == {"linear"}:
                continue
            layouts = _Layouts(linear, set(choice) - {"linear"})
            self.layouts.append(layouts)
            self._originals.append((linear, linear.forward))
            linear.forward = self._make_forward(linear, layouts, choice)

    @staticmethod
    def _plan(linears: list[torch.nn.Linear]) -> dict[str, list[str]]:
        path = cache_dir() / "fast_linear.json"
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        changed = False
        for linear in linears:
            key = _profile_key(linear.out_features, linear.in_features, linear.weight.dtype, linear.bias is not None)
            if key not in known or len(known[key]) != len(BUCKETS):
                known[key] = _choose(linear.out_features, linear.in_features, linear.weight.dtype,
                                     linear.bias is not None)
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

    @staticmethod
    def _make_forward(linear: torch.nn.Linear, layouts: _Layouts, choice: list[str]) -> Callable:
        original = linear.forward
        in_f = linear.in_features

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not _active or x.requires_grad:
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

    def remove(self) -> None:
        for linear, forward in self._originals:
            linear.forward = forward
        self._originals.clear()
        self.layouts.clear()
