"""LoRA adapters on the engine's linear layers, several in one step (the Punica / S-LoRA scheme).

A step's base linear runs once for the whole batch, on whatever path the platform chose for it (the measured
dense path, the packed GGUF kernels, `F.linear`); then each adapter in the step adds its low-rank product to
its own rows only:

    y = x W^T                                   every row, one matmul
    y[rows of a] += (x[rows of a] A_a^T) (s_a B_a^T)   per adapter a in the step

The adapted layers' `forward`s are wrapped once at load (recorded in the engine's `ModuleInstallation`, so the
model is handed back as it came); the wrapper adds nothing outside a step that has adapter rows, so base-only
steps and training forwards run exactly as before. Rows of one adapter that sit together in the step are a
slice (no copy); scattered rows are gathered and scattered back with `index_add_`. The native decode step
(every layer in one C call) adds the same deltas in C from these very tensors (`runner/native_lora.py`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from vriksha.device import resolve_or_host
from vriksha.engine.platform.module_installation import ModuleInstallation
from vriksha.lora import AdapterError, LoraAdapter

logger = logging.getLogger(__name__)

__all__ = ["LoraLinears", "LoraRows"]

Rows = slice | torch.Tensor


@dataclass(slots=True)
class LoraRows:
    """Which rows of a step each adapter owns: (adapter id, rows) for every adapter present; base rows (id 0)
    are not listed."""

    groups: list[tuple[int, Rows]]

    @classmethod
    def of(cls, ids: Sequence[int], device: torch.device | str | None = None) -> LoraRows | None:
        """The groups of per-row adapter ids `ids` (0: the base model); None when every row is the base's."""
        rows: dict[int, list[int]] = {}
        for i, lora_id in enumerate(ids):
            if lora_id:
                rows.setdefault(lora_id, []).append(i)
        if not rows:
            return None
        groups: list[tuple[int, Rows]] = []
        for lora_id, where in rows.items():
            if where[-1] - where[0] + 1 == len(where):
                groups.append((lora_id, slice(where[0], where[-1] + 1)))
            else:
                groups.append(
                    (lora_id, torch.tensor(where, dtype=torch.int64, device=resolve_or_host(device)))
                )
        return cls(groups)


def adaptable_linears(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The model's linear layers an adapter may target: every `nn.Linear` but the output head (whose rows
    are the sampled ones, not the step's)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head}


class LoraLinears:
    """The loaded adapters' weights, by adapter id, and the wrapped forwards of the layers they may adapt."""

    def __init__(self, model: torch.nn.Module, installation: ModuleInstallation) -> None:
        self.linears = adaptable_linears(model)
        if not self.linears:
            raise AdapterError("the model has no linear layers a LoRA adapter could adapt")
        first = next(iter(self.linears.values())).weight
        self.dtype = first.dtype if first.is_floating_point() else torch.float32
        self.device = first.device
        # adapter id -> module name -> (A^T [in, r], scaling * B^T [r, out]) in the engine's dtype
        self.weights: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.rows: LoraRows | None = None
        # called with an adapter's id as its weights are dropped (what holds pointers into them forgets them)
        self.removal_hooks: list[Callable[[int], None]] = []
        for name, module in self.linears.items():
            installation.replace_forward(module, self._forward(name, module.forward))

    def shapes(self) -> dict[str, tuple[int, int]]:
        """(out_features, in_features) of every adaptable layer, by module name."""
        return {n: (m.out_features, m.in_features) for n, m in self.linears.items()}

    def add(self, lora_id: int, adapter: LoraAdapter) -> None:
        """Hold `adapter`'s weights under `lora_id` (checked against the base model's layers first)."""
        adapter.check_base(self.shapes())
        s = adapter.scaling
        with torch.inference_mode(False), torch.no_grad():
            self.weights[lora_id] = {
                module: (
                    w.a.detach().to(self.device, torch.float32).t().contiguous().to(self.dtype),
                    (w.b.detach().to(self.device, torch.float32) * s).t().contiguous().to(self.dtype),
                )
                for module, w in adapter.modules.items()
            }

    def remove(self, lora_id: int) -> None:
        for forget in self.removal_hooks:
            forget(lora_id)
        self.weights.pop(lora_id, None)

    @contextlib.contextmanager
    def engaged(self, rows: LoraRows | None) -> Iterator[None]:
        """Within: the adapted layers add the deltas of `rows`' adapters (nothing when None)."""
        previous, self.rows = self.rows, rows
        try:
            yield
        finally:
            self.rows = previous

    def _forward(self, name: str, base: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
        def forward(x: torch.Tensor) -> torch.Tensor:
            y = base(x)
            rows = self.rows
            return y if rows is None else self._add_deltas(name, x, y, rows)

        return forward

    def _add_deltas(self, name: str, x: torch.Tensor, y: torch.Tensor, rows: LoraRows) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y2 = y.reshape(-1, y.shape[-1])
        if y2.data_ptr() != y.data_ptr() or not y2.is_contiguous():
            y2 = y2.contiguous()
        for lora_id, where in rows.groups:
            ab = self.weights[lora_id].get(name)
            if ab is None:
                continue  # this adapter leaves the layer alone
            a, b = ab
            if isinstance(where, slice):
                y2[where] += (x2[where].to(a.dtype) @ a @ b).to(y2.dtype)
            else:
                y2.index_add_(0, where, (x2.index_select(0, where).to(a.dtype) @ a @ b).to(y2.dtype))
        return y2.view(y.shape)
