"""GGML's block formats dequantized with torch: the legacy 32-weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and
the K-quants' 256-weight super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).

Each function takes blocks as uint8 [n, bytes a block] and returns fp32 [n, weights a block], with the
arithmetic of the `gguf` package's reference dequantizer (`gguf.quants`) step for step (the same products and
sums in the same order, none fused), so the results are bit-identical to it; the tests hold every format to
that. A GGUF's tensors are converted through `dequantize_like_gguf`, which the conversion puts in place of
`gguf.dequantize` (`gguf_reads.py`): the same values, from torch's vectorised kernels on every core instead
of numpy's single-threaded ones.

Layouts (per block; `f16` an IEEE half, multi-byte fields little-endian):

| type | weights | bytes | fields                                                      | weight                  |
|------|--------:|------:|-------------------------------------------------------------|-------------------------|
| Q4_0 |      32 |    18 | f16 d, 16 bytes of 4-bit q                                  | d * (q - 8)             |
| Q4_1 |      32 |    20 | f16 d, f16 m, 16 bytes of 4-bit q                           | d * q + m               |
| Q5_0 |      32 |    22 | f16 d, 32 high bits, 16 bytes of low 4 bits                 | d * (q - 16)            |
| Q5_1 |      32 |    24 | f16 d, f16 m, 32 high bits, 16 bytes of low 4 bits          | d * q + m               |
| Q8_0 |      32 |    34 | f16 d, 32 int8 q                                            | d * q                   |
| Q2_K |     256 |    84 | 16 scale bytes (4-bit scale, 4-bit min), 64 bytes of 2-bit q, f16 d, f16 dmin | d*sc*q - dmin*m |
| Q3_K |     256 |   110 | 32 bytes high bits, 64 bytes of low 2 bits, 12 bytes of 6-bit scales, f16 d | d*(sc-32)*(q-4*!h) |
| Q4_K |     256 |   144 | f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit q | d*sc*q - dmin*m |
| Q5_K |     256 |   176 | f16 d, f16 dmin, 12 bytes of scales and mins, 32 bytes high bits, 128 bytes low | d*sc*q - dmin*m |
| Q6_K |     256 |   210 | 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales, f16 d | d*sc*(q - 32) |

In the 32-weight 4-bit formats byte j holds weight j in its low nibble and weight j + 16 in its high one; the
K-quants spread their sub-blocks of 16 or 32 weights over the bytes as written out below.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

QK_K = 256
# type name -> (weights a block, bytes a block)
BLOCKS: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (QK_K, 84),
    "Q3_K": (QK_K, 110),
    "Q4_K": (QK_K, 144),
    "Q5_K": (QK_K, 176),
    "Q6_K": (QK_K, 210),
}
# weights dequantized at a time: every temporary of a chunk stays under torch's grain size (32,768 elements),
# so each operation runs on the calling thread (no OpenMP team to wake and join, which on a loaded machine can
# cost milliseconds an operation) and in L2; chunks are spread over a pool of threads instead
_CHUNK_WEIGHTS = 1 << 14


def _f16(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The half at byte `start` of each block, as fp32 [n, 1]."""
    return raw[:, start : start + 2].contiguous().view(torch.float16).float()


def _shifted(data: torch.Tensor, shifts: tuple[int, ...]) -> torch.Tensor:
    """data [n, groups, width] >> each shift, masked to the shifts' field width: [n, groups, shifts, width]."""
    by = torch.tensor(shifts, dtype=torch.int32).view(1, 1, -1, 1)
    return (data.unsqueeze(2) >> by) & ((1 << (shifts[1] - shifts[0])) - 1)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 2k]: the low nibbles of every byte, then the high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _bits32(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian 32-bit mask at byte `start` of each block -> its 32 bits [n, 32], bit 0 first."""
    mask = raw[:, start : start + 4].contiguous().view(torch.int32)
    return (mask >> torch.arange(32, dtype=torch.int32)) & 1


# Each format below takes `raw` (the uint8 blocks, for their halves and signed bytes) and `b` (the same bytes
# widened to int32, for the bit fields: torch's uint8 shifts and masks are several times slower).


def _q4_0(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _f16(raw, 0) * (_nibbles(b[:, 2:]) - 8).float()


def _q4_1(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _f16(raw, 0) * _nibbles(b[:, 4:]).float() + _f16(raw, 2)


def _q5_0(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 6:]) | (_bits32(raw, 2) << 4)
    return _f16(raw, 0) * (q - 16).float()


def _q5_1(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:]) | (_bits32(raw, 4) << 4)
    return _f16(raw, 0) * q.float() + _f16(raw, 2)


def _q8_0(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return raw[:, 2:].contiguous().view(torch.int8).float() * _f16(raw, 0)


def _q2_k(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, :16]
    d, dmin = _f16(raw, 80), _f16(raw, 82)
    dl = (d * (scales & 0x0F).float()).view(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).view(n, 16, 1)
    q = _shifted(b[:, 16:80].reshape(n, 2, 32), (0, 2, 4, 6)).reshape(n, 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    low = _shifted(b[:, 96:104].reshape(n, 1, 8), (0, 4)).reshape(n, 16)
    high = _shifted(b[:, 104:108].reshape(n, 1, 4), (0, 2, 4, 6)).reshape(n, 16)
    dl = (_f16(raw, 108) * ((low | (high << 4)) - 32).float()).view(n, 16, 1)
    ql = _shifted(b[:, 32:96].reshape(n, 2, 32), (0, 2, 4, 6)).reshape(n, 16, 16)
    qh = _shifted(b[:, :32].reshape(n, 1, 32), tuple(range(8))).reshape(n, 16, 16) ^ 1
    return (dl * (ql - (qh << 2)).float()).reshape(n, QK_K)


def _scale_min_k4(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins packed in bytes 4..15 of a Q4_K / Q5_K block."""
    d, m, md = b[:, 4:8], b[:, 8:12], b[:, 12:16]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mins


def _q4_k(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mins = _scale_min_k4(b)
    d = (_f16(raw, 0) * sc.float()).view(n, 8, 1)
    dm = (_f16(raw, 2) * mins.float()).view(n, 8, 1)
    q = _shifted(b[:, 16:].reshape(n, 4, 32), (0, 4)).reshape(n, 8, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mins = _scale_min_k4(b)
    d = (_f16(raw, 0) * sc.float()).view(n, 8, 1)
    dm = (_f16(raw, 2) * mins.float()).view(n, 8, 1)
    ql = _shifted(b[:, 48:].reshape(n, 4, 32), (0, 4)).reshape(n, 8, 32)
    qh = _shifted(b[:, 16:48].reshape(n, 1, 32), tuple(range(8))).reshape(n, 8, 32)
    return (d * (ql | (qh << 4)).float() - dm).reshape(n, QK_K)


def _q6_k(raw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = raw[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(raw, 208) * scales).view(n, 16, 1)
    ql = _shifted(b[:, :128].reshape(n, 2, 64), (0, 4)).reshape(n, 8, 32)
    qh = _shifted(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6)).reshape(n, 8, 32)
    q = ((ql | (qh << 4)) - 32).reshape(n, 16, 16).float()
    return (d * q).reshape(n, QK_K)


_DEQUANTIZE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


def dequantize_blocks(type_name: str, data: torch.Tensor) -> torch.Tensor:
    """uint8 [..., k * bytes a block] in `type_name` (a GGML type, e.g. "Q4_K") -> fp32 [..., k * weights]."""
    weights, size = BLOCKS[type_name]
    if data.dtype != torch.uint8 or data.shape[-1] % size:
        raise ValueError(f"{type_name} data must be uint8 rows of whole {size}-byte blocks, got {data.shape}")
    blocks = data.reshape(-1, size)
    out = torch.empty(blocks.shape[0], weights, dtype=torch.float32)
    step = _CHUNK_WEIGHTS // weights
    dequantize = _DEQUANTIZE[type_name]

    def run(start: int) -> None:
        chunk = blocks[start : start + step]
        out[start : start + chunk.shape[0]] = dequantize(chunk, chunk.to(torch.int32))

    starts = range(0, blocks.shape[0], step)
    workers = min(torch.get_num_threads(), len(starts))
    if workers <= 1:
        for start in starts:
            run(start)
    else:  # torch releases the GIL inside each operation
        with ThreadPoolExecutor(workers) as pool:
            for _ in pool.map(run, starts):
                pass
    return out.reshape(*data.shape[:-1], data.shape[-1] // size * weights)


def dequantize_like_gguf(data: np.ndarray, qtype) -> np.ndarray:
    """`gguf.dequantize(data, qtype)` for the block formats above (bit-identical), through torch; other types
    (F32, F16, BF16, the IQ and ternary formats) go to the `gguf` package's own."""
    import gguf

    name = getattr(qtype, "name", str(qtype))
    if name not in _DEQUANTIZE:
        return gguf.quants.dequantize(data, qtype)
    with warnings.catch_warnings():  # a read-only map of the file: only read here
        warnings.simplefilter("ignore", UserWarning)
        rows = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8))
    return dequantize_blocks(name, rows).numpy()
