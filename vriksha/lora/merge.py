"""An adapter merged in place into a model's linear weights, and taken out again bit for bit.

Merging writes `W + scaling * B A` over each adapted weight, so an engine runs the adapted model at the base
model's speed (no extra matmuls, its fast linear paths unchanged) without a second copy of the weights.
Subtracting the same delta does not always give `W` back: `(W + D) - D` rounds twice, and where `W + D` crosses
a power of two or lands on a tie the result is one unit in the last place off. So the merge first computes
what the unmerge will give, one layer at a time, and keeps the original values at the positions where it
differs (a small fraction of the positions: see docs/training.md for the measured share). The unmerge
subtracts and puts those values back, and checks a checksum of the restored weight: the base comes back
exactly, or the unmerge says so loudly instead of letting the base drift.

The delta is computed the same way both times (the same float32 matmul of the same A and B, on the same
thread count), which is what makes the subtraction repeat the merge's prediction bit for bit. Both walk each
weight in blocks of rows that fit in the core's cache, computing that block's delta, sums and checks there, so
a merge reads and writes each weight about once from memory instead of once per step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from vriksha.errors import VrikshaError
from vriksha.lora.adapter import LoraAdapter, LoraWeights

logger = logging.getLogger(__name__)

__all__ = ["LoraMergeError", "MergedWeights"]

_BITS = {4: torch.int32, 2: torch.int16, 8: torch.int64}
_BLOCK_BYTES = 1 << 18  # one block of rows of a weight, its delta and their sums stay in a core's L2 cache


class LoraMergeError(VrikshaError):
    """An adapter could not be merged into (or taken out of) a model's weights."""


@dataclass(slots=True)
class _Restore:
    """What brings one merged weight back: its original values where subtracting differs, and a checksum."""

    positions: torch.Tensor  # flat indices, int64
    values: torch.Tensor
    checksum: int


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(_BITS[w.element_size()])


def _checksum(w: torch.Tensor) -> int:
    return int(_bits(w).sum(dtype=torch.int64))


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    """Compute on `count` threads (the merge's), so that the unmerge's matmul repeats the merge's exactly."""
    now = torch.get_num_threads()
    if now != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if now != count:
            torch.set_num_threads(now)


def _row_blocks(w: torch.Tensor) -> Iterator[tuple[int, int]]:
    rows = max(1, _BLOCK_BYTES // max(1, w.shape[1] * 4))
    for r0 in range(0, w.shape[0], rows):
        yield r0, min(r0 + rows, w.shape[0])


def _block_delta(adapter: LoraAdapter, name: str, r0: int, r1: int, device: torch.device) -> torch.Tensor:
    """`scaling * B[r0:r1] @ A`: rows r0..r1 of the delta merging adds to module `name`'s weight."""
    w = adapter.modules[name]
    return (w.b[r0:r1].float() @ w.a.float()).mul_(adapter.scaling).to(device)


def _add(w: torch.Tensor, delta: torch.Tensor, sign: float) -> torch.Tensor:
    """`w + sign * delta` rounded to `w`'s dtype (the arithmetic in float32)."""
    if w.dtype == torch.float32:
        return torch.add(w, delta, alpha=sign)
    return torch.add(w.float(), delta, alpha=sign).to(w.dtype)


class MergedWeights:
    """The adapter (at most one) merged into `weights`: the base model's linear weights [out, in], updated in
    place, by module name. `merge(adapter)` and `unmerge()` alternate; the weights hold the base between them."""

    def __init__(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.weights = dict(weights)
        self.adapter: LoraAdapter | None = None
        self._restore: dict[str, _Restore] = {}
        self.fixed_positions = 0  # of the last merge: where subtracting alone would not restore the base
        self._threads = 1

    @classmethod
    def of_module(cls, module: torch.nn.Module) -> MergedWeights:
        """Every `nn.Linear` weight of `module`, by module name."""
        return cls({n: m.weight.data for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)})

    def shapes(self) -> dict[str, tuple[int, int]]:
        return {n: (int(w.shape[0]), int(w.shape[1])) for n, w in self.weights.items()}

    @torch.no_grad()
    def merge(self, adapter: LoraAdapter) -> None:
        """Add `adapter` to the weights in place (after `unmerge` of the one merged before, if any)."""
        if self.adapter is not None:
            raise LoraMergeError(
                f"adapter {self.adapter.name!r} is still merged; unmerge it before merging {adapter.name!r}"
            )
        adapter.check_base(self.shapes())
        # a copy of A and B: the unmerge needs the very delta the merge added, whatever the caller does next
        kept = {
            n: LoraWeights(w.a.detach().clone(), w.b.detach().clone()) for n, w in adapter.modules.items()
        }
        frozen = LoraAdapter(
            adapter.name, adapter.rank, adapter.alpha, adapter.target_modules, kept, adapter.use_rslora
        )
        restore: dict[str, _Restore] = {}
        for name in kept:
            w = self.weights[name]
            positions, values, checksum = [], [], 0
            for r0, r1 in _row_blocks(w):
                block = w[r0:r1]
                delta = _block_delta(frozen, name, r0, r1, w.device)
                merged = _add(block, delta, 1.0)
                wrong = (_bits(_add(merged, delta, -1.0)) != _bits(block)).view(-1).nonzero().squeeze(1)
                positions.append(wrong + r0 * w.shape[1])
                values.append(block.reshape(-1)[wrong])
                checksum += _checksum(block)
                block.copy_(merged)
            restore[name] = _Restore(torch.cat(positions), torch.cat(values), checksum)
        self.adapter, self._restore, self._threads = frozen, restore, torch.get_num_threads()
        self.fixed_positions = sum(r.positions.numel() for r in restore.values())

    @torch.no_grad()
    def unmerge(self) -> bool:
        """Take the merged adapter out, restoring the base bit for bit; False when none was merged."""
        adapter = self.adapter
        if adapter is None:
            return False
        with _threads(self._threads):
            for name, r in self._restore.items():
                w = self.weights[name]
                checksum = 0
                for r0, r1 in _row_blocks(w):
                    block = w[r0:r1]
                    block.copy_(_add(block, _block_delta(adapter, name, r0, r1, w.device), -1.0))
                    lo, hi = torch.searchsorted(r.positions, torch.tensor([r0, r1]) * w.shape[1]).tolist()
                    block.view(-1)[r.positions[lo:hi] - r0 * w.shape[1]] = r.values[lo:hi]
                    checksum += _checksum(block)
                if checksum != r.checksum:
                    raise LoraMergeError(
                        f"unmerging adapter {adapter.name!r} did not restore {name} bit for bit (the weight "
                        "was written to while the adapter was merged?)"
                    )
        self.adapter, self._restore = None, {}
        return True

    def forget(self) -> None:
        """The weights were overwritten whole (a full weight update): no adapter is merged any more."""
        self.adapter, self._restore = None, {}
