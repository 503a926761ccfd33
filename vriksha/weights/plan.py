"""What one weight update moves: tensor specs, their byte layout in a flat buffer, and bucket plans.

Both sides compute layouts from the same spec list (the trainer sends it with the update), so the data
planes carry raw bytes only and never Python objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from vriksha.errors import VrikshaError

ALIGN = 64  # byte alignment of every tensor in a flat buffer (any dtype's view is then legal)


class WeightTransferError(VrikshaError):
    """A weight update could not be applied (mismatched names or shapes, a dead peer, a torn file)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str  # torch dtype name without the prefix: "float32", "bfloat16"
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.torch_dtype.itemsize

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict) -> TensorSpec:
        return cls(str(d["name"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]))

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> TensorSpec:
        return cls(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(specs: Iterable[TensorSpec]) -> tuple[list[int], int]:
    """Byte offsets of each tensor in one flat buffer, and the buffer's size."""
    offsets, pos = [], 0
    for s in specs:
        offsets.append(pos)
        pos = _aligned(pos + s.nbytes)
    return offsets, pos


@dataclass(frozen=True, slots=True)
class Bucket:
    specs: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]
    nbytes: int


def buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[Bucket]:
    """Greedy packing in order; a tensor larger than `bucket_bytes` travels alone in its own bucket."""
    if bucket_bytes <= 0:
        raise WeightTransferError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    out: list[Bucket] = []
    cur: list[TensorSpec] = []
    for s in specs:
        if cur and layout([*cur, s])[1] > bucket_bytes:
            out.append(_bucket(cur))
            cur = []
        cur.append(s)
    if cur:
        out.append(_bucket(cur))
    return out


def _bucket(specs: list[TensorSpec]) -> Bucket:
    offsets, size = layout(specs)
    return Bucket(tuple(specs), tuple(offsets), size)


def view(buf: torch.Tensor, offset: int, spec: TensorSpec) -> torch.Tensor:
    """The tensor `spec` inside the flat uint8 buffer `buf` at `offset` (a view, no copy)."""
    return buf[offset : offset + spec.nbytes].view(spec.torch_dtype).view(spec.shape)


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (bit-level identity of parameters across processes)."""
    flat = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def check_sent(sent: list[TensorSpec], target: Mapping[str, torch.Tensor]) -> None:
    """Every sent tensor exists in `target` with the same dtype and shape, and is sent once: checked before
    any byte is copied, so a mismatched update is refused whole."""
    seen: set[str] = set()
    for s in sent:
        if s.name in seen:
            raise WeightTransferError(f"the update sends {s.name!r} twice")
        seen.add(s.name)
        p = target.get(s.name)
        if p is None:
            raise WeightTransferError(f"the engine has no parameter {s.name!r}; is it the same model family?")
        if TensorSpec.of(s.name, p) != s:
            raise WeightTransferError(
                f"{s.name}: the update sends {s.dtype}{list(s.shape)} but the engine holds "
                f"{str(p.dtype).removeprefix('torch.')}{list(p.shape)}"
            )


def check_specs(sent: list[TensorSpec], target: dict[str, torch.Tensor]) -> None:
    """Every sent tensor must exist in `target` with the same dtype and shape; every target must be sent."""
    names = {s.name for s in sent}
    missing = sorted(set(target) - names)
    if missing:
        raise WeightTransferError(
            f"the update lacks {len(missing)} parameter(s) of the engine, e.g. {missing[0]!r}"
        )
    check_sent(sent, target)


def parse_specs(raw: object) -> list[TensorSpec]:
    """The `specs` list of an update's info, as sent over HTTP (a malformed one is refused by name)."""
    if not isinstance(raw, list):
        raise WeightTransferError("update_info.specs must be a list of {name, dtype, shape}")
    out = []
    for i, d in enumerate(raw):
        try:
            spec = TensorSpec.from_json(d)
            spec.torch_dtype  # noqa: B018 - a dtype torch does not know is refused here
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WeightTransferError(f"update_info.specs[{i}] is not a tensor spec ({exc!r})") from None
        if not isinstance(spec.torch_dtype, torch.dtype) or any(d < 0 for d in spec.shape):
            raise WeightTransferError(f"update_info.specs[{i}] has a bad dtype or shape: {d!r}")
        out.append(spec)
    return out
