"""The LoRA adapters as the native decode step reads them (`native/lora_delta.c`): one table per loaded adapter.

An adapter's table holds, for every decoder layer and each of its seven projections, the pointers to the
adapter's A^T [in, r] and s B^T [r, out] that `LoraLinears` holds (no copy), or NULL where the adapter leaves
that projection alone. A table is built the first time a step carries the adapter and is dropped the moment
`LoraLinears` drops the adapter's weights (its removal hook), so a step never sees an unloaded adapter's
pointers; each table also keeps the tensors it points into alive. Each step passes one table pointer per row
(NULL for the base model's rows), so a batch mixing several adapters and base rows stays one native call.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import nn

import vriksha.device as devices
from vriksha.engine.platform.lora_linear import LoraLinears, LoraRows

_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # vl_lora_layer's order (lora_delta.h)


class _Lora(ctypes.Structure):
    _fields_ = [("a", _PTR), ("b", _PTR), ("rank", _I64)]


class _LoraLayer(ctypes.Structure):
    _fields_ = [("w", _Lora * len(PROJECTIONS))]


@dataclass(slots=True)
class AdapterTable:
    """One adapter's `vl_lora_layer` array, the weights it points into, and its largest rank."""

    layers: ctypes.Array
    source: dict[str, tuple[torch.Tensor, torch.Tensor]]  # LoraLinears.weights[lora_id]
    rank: int


@dataclass(slots=True)
class StepLora:
    """A step's LoRA rows for `vl_decode`: one table pointer per row (NULL for base rows), the largest rank."""

    rows: ctypes.Array
    rank: int


def layer_projections(layer: nn.Module) -> tuple[nn.Module, ...]:
    """A decoder layer's seven projections, in the order of the native step's slots (`vl_lora_layer`)."""
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)


def projections(layers: list[nn.Module]) -> dict[nn.Module, tuple[int, int]]:
    """Each projection module of the decoder layers -> (layer index, its slot in `vl_lora_layer`)."""
    out = {}
    for i, layer in enumerate(layers):
        for which, module in enumerate(layer_projections(layer)):
            out[module] = (i, which)
    return out


class NativeLoras:
    """The adapter tables of one native decode path, kept in step with `lora`'s loaded adapters."""

    def __init__(self, lora: LoraLinears, layers: list[nn.Module]) -> None:
        self.lora = lora
        self.num_layers = len(layers)
        where = projections(layers)
        # module name -> (layer, slot); a module an adapter may target but the native step does not run is absent
        self.slots = {name: where[m] for name, m in lora.linears.items() if m in where}
        self.tables: dict[int, AdapterTable | None] = {}  # None: an adapter the native step cannot add
        lora.removal_hooks.append(self.forget)

    def forget(self, lora_id: int) -> None:
        self.tables.pop(lora_id, None)

    def covers(self, rows: LoraRows) -> bool:
        """Whether the native step can add every adapter of `rows` (else the step takes the torch path)."""
        return all(self.table(lora_id) is not None for lora_id, _ in rows.groups)

    def table(self, lora_id: int) -> AdapterTable | None:
        source = self.lora.weights.get(lora_id)
        if source is None:
            raise RuntimeError(f"a step carries LoRA adapter id {lora_id}, which is not loaded")
        kept = self.tables.get(lora_id, False)
        if kept is not False and (kept is None or kept.source is source):
            return kept
        built = self._build(source)
        self.tables[lora_id] = built
        return built

    def _build(self, source: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> AdapterTable | None:
        layers = (_LoraLayer * self.num_layers)()
        rank = 0
        for name, (a, b) in source.items():
            slot = self.slots.get(name)
            if slot is None or a.dtype != torch.float32 or not (a.is_contiguous() and b.is_contiguous()):
                return None
            if not (devices.is_host(a.device) and devices.is_host(b.device)):
                return None
            layer, which = slot
            layers[layer].w[which] = _Lora(a.data_ptr(), b.data_ptr(), a.shape[1])
            rank = max(rank, a.shape[1])
        return AdapterTable(layers, source, rank)

    def step(self, rows: LoraRows, batch: int) -> StepLora:
        """The per-row table pointers of a step of `batch` rows whose adapters' rows are `rows`."""
        pointers: list[int | None] = [None] * batch
        rank = 0
        for lora_id, where in rows.groups:
            table = self.table(lora_id)
            if table is None:
                raise RuntimeError(f"LoRA adapter id {lora_id} cannot run in the native decode step")
            address = ctypes.addressof(table.layers)
            indices = range(batch)[where] if isinstance(where, slice) else where.tolist()
            for t in indices:
                pointers[t] = address
            rank = max(rank, table.rank)
        return StepLora((_PTR * batch)(*pointers), rank)
