"""Packed weight formats the engine serves as they are: GGUF Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K
blocks and per-channel int8.

A `PackedWeight` holds one linear layer's weight [out, in] in its packed bytes, one row of blocks per output
feature (GGML's layout: blocks of 32, or the K-quants' super-blocks of 256, along the input dimension):

| qtype | bytes / 32 weights | block                                  | weight            |
|-------|-------------------:|----------------------------------------|-------------------|
| q4_0  | 18                 | fp16 d, 16 bytes of 4-bit q            | (q - 8) * d       |
| q4_1  | 20                 | fp16 d, fp16 m, 16 bytes of 4-bit q    | q * d + m         |
| q8_0  | 34                 | fp16 d, 32 int8 q                      | q * d             |
| int8  | 32 (+4 per row)    | int8 q; one fp32 scale per output row  | q * scale[row]    |
| q5_0  | 22                 | fp16 d, 32 high bits, 16 bytes of low nibbles | (q - 16) * d |
| q5_1  | 24                 | fp16 d, fp16 m, 32 high bits, 16 bytes of low nibbles | q * d + m |
| q4_k  | 144 / 256          | fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles | d sc q - dmin m |
| q5_k  | 176 / 256          | as q4_k with 32 bytes of high bits     | d sc q - dmin m   |
| q6_k  | 210 / 256          | 128 bytes low nibbles, 64 of high pairs, 16 int8 scales, fp16 d | d sc (q - 32) |

Byte j of a 4-bit block holds element j in its low nibble and element j + 16 in its high one; the 5-bit and
K-quant layouts are written out in `ggml_blocks.py` and `native/kquant.h`.
`dequantize` is the torch reference every kernel is tested against (for the 5-bit and K-quant blocks,
`ggml_blocks`, bit-identical to the `gguf` package).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vriksha.errors import ModelLoadError

BLOCK = 32
BLOCK_BYTES = {
    "q4_0": 18,
    "q4_1": 20,
    "q8_0": 34,
    "q5_0": 22,
    "q5_1": 24,
    "q4_k": 144,
    "q5_k": 176,
    "q6_k": 210,
}
# weights a block (a K-quant's super-block) holds along the input dimension
BLOCK_WEIGHTS = {qtype: 256 if qtype.endswith("_k") else BLOCK for qtype in BLOCK_BYTES}
QTYPES = (*BLOCK_BYTES, "int8")


@dataclass(slots=True)
class PackedWeight:
    qtype: str
    data: torch.Tensor  # uint8 [out, row bytes] for GGUF blocks; int8 [out, in] for int8
    out_features: int
    in_features: int
    scale: torch.Tensor | None = None  # int8: fp32 [out]
    # (rows a tile, "pairs" or "quads"): the copy a tiled path reads
    tiled: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.qtype not in QTYPES:
            raise ModelLoadError(f"unknown packed weight type {self.qtype!r}; known: {', '.join(QTYPES)}")
        if self.qtype != "int8" and self.in_features % BLOCK_WEIGHTS[self.qtype]:
            raise ModelLoadError(
                f"{self.qtype} rows need a multiple of {BLOCK_WEIGHTS[self.qtype]} inputs, got {self.in_features}"
            )
        want = (self.out_features, row_bytes(self.qtype, self.in_features))
        if tuple(self.data.shape) != want or not self.data.is_contiguous():
            raise ModelLoadError(f"{self.qtype} data must be contiguous {want}, got {tuple(self.data.shape)}")

    @property
    def nbytes(self) -> int:
        extra = self.scale.numel() * 4 if self.scale is not None else 0
        return self.data.numel() + extra


def row_bytes(qtype: str, in_features: int) -> int:
    if qtype == "int8":
        return in_features
    return in_features // BLOCK_WEIGHTS[qtype] * BLOCK_BYTES[qtype]


def quantize_int8(weight: torch.Tensor) -> PackedWeight:
    """Symmetric per-output-channel int8: scale = max |w| / 127 per row, q = round(w / scale)."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return PackedWeight("int8", q, w.shape[0], w.shape[1], scale.contiguous())


def requantize_int8_(packed: PackedWeight, weight: torch.Tensor) -> None:
    """Refresh an int8 weight in place from new fp32 values (after the weights were updated)."""
    fresh = quantize_int8(weight)
    packed.data.copy_(fresh.data)
    packed.scale.copy_(fresh.scale)


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16).float()  # [..., 1]


def dequantize(packed: PackedWeight) -> torch.Tensor:
    """The fp32 weight [out, in] (the reference the native kernels are held to)."""
    if packed.qtype == "int8":
        return packed.data.float() * packed.scale[:, None]
    if packed.qtype not in ("q4_0", "q4_1", "q8_0"):
        from vriksha.loading.ggml_blocks import dequantize_blocks

        return dequantize_blocks(packed.qtype.upper(), packed.data)
    blocks = packed.data.view(packed.out_features, -1, BLOCK_BYTES[packed.qtype])
    d = _f16(blocks, 0)
    if packed.qtype == "q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(packed.out_features, packed.in_features)
    qs = blocks[..., 4:] if packed.qtype == "q4_1" else blocks[..., 2:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()
    w = q * d + _f16(blocks, 2) if packed.qtype == "q4_1" else (q - 8) * d
    return w.reshape(packed.out_features, packed.in_features)


def permute_rows(packed: PackedWeight, order: torch.Tensor) -> PackedWeight:
    """The same weight with its output rows reordered: row i of the result is row order[i] of `packed` (every
    format keeps a row's blocks in its own bytes, so rows move whole)."""
    scale = packed.scale[order].contiguous() if packed.scale is not None else None
    return PackedWeight(
        packed.qtype, packed.data[order].contiguous(), packed.out_features, packed.in_features, scale
    )
