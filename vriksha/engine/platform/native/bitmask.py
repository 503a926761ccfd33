"""The grammar-mask kernel (`bitmask.c`): llguidance's packed int32 token masks applied to fp32 logits in place.

Built like the other native kernels, once per instruction-set variant (`isa.py`), and the widest variant this
CPU's flags allow is loaded; None without a C compiler or with `VRIKSHA_NATIVE=0` (the caller then unpacks
the masks with numpy)."""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from vriksha.device import is_host
from vriksha.engine.platform.native import HEADERS, build, isa, load_variant
from vriksha.profiling.annotate import native_call

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("bitmask.c")
PATHS = {1: "scalar", 2: "avx2", 4: "avx512"}
_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


class BitmaskKernel:
    """`apply_`: the masks of some logits rows, in place. `path` is the code path this build runs."""

    def __init__(self, path: Path, variant: isa.Variant) -> None:
        lib = ctypes.CDLL(str(path))
        lib.vb_apply_bitmask_f32.argtypes = [_PTR, _I64, _PTR, _I64, _PTR, _I64, _I64, _I64, _INT]
        lib.vb_apply_bitmask_f32.restype = None
        lib.vb_variant.restype = _INT
        self._lib = lib
        self.library = path
        self.isa = variant
        self.path = PATHS[lib.vb_variant()]

    @staticmethod
    def accepts(logits: torch.Tensor) -> bool:
        """Whether `logits` is a tensor this kernel writes: fp32, 2-D, on the CPU, each row contiguous."""
        return (
            is_host(logits.device)
            and logits.dtype == torch.float32
            and logits.dim() == 2
            and logits.stride(1) == 1
        )

    def apply_(self, logits: torch.Tensor, rows: list[int] | None, bitmask: torch.Tensor) -> None:
        """Set logits[rows[i], t] = -inf where bit t of mask i is 0 (rows None: mask i is row i); `bitmask` is
        int32 [len(rows), words], on the CPU. Writes through the pointer: `logits` may be an inference tensor."""
        if not self.accepts(logits):
            raise TypeError(
                f"the bitmask kernel takes 2-D float32 CPU logits with contiguous rows, got {logits.dtype} "
                f"{tuple(logits.shape)} on {logits.device}"
            )
        n, words = bitmask.shape
        if bitmask.dtype != torch.int32 or not is_host(bitmask.device):
            raise TypeError(f"the bitmask must be int32 on the CPU, got {bitmask.dtype} on {bitmask.device}")
        if bitmask.stride(1) != 1:
            bitmask = bitmask.contiguous()
        index = None
        if rows is not None:
            if len(rows) != n:
                raise ValueError(f"{len(rows)} rows for {n} masks")
            if rows and (min(rows) < 0 or max(rows) >= logits.shape[0]):
                raise IndexError(f"a masked row is outside the {logits.shape[0]} logits rows: {rows}")
            index = torch.tensor(rows, dtype=torch.int64)
        elif n > logits.shape[0]:
            raise IndexError(f"{n} masks for {logits.shape[0]} logits rows")
        native_call(self._lib.vb_apply_bitmask_f32, "apply_bitmask")(
            logits.data_ptr(),
            logits.stride(0),
            index.data_ptr() if index is not None else None,
            n,
            bitmask.data_ptr(),
            bitmask.stride(0),
            words,
            logits.shape[1],
            torch.get_num_threads(),
        )


@functools.cache
def bitmask_kernel(variant: str | None = None) -> BitmaskKernel | None:
    """The kernel of `variant` (default: the widest this CPU runs), built on first call; None where it cannot
    run (the reason is logged once)."""
    loaded = load_variant(
        variant,
        lambda compiler, v: build(compiler, v, (SOURCE,), HEADERS, "bitmask"),
        "grammar masks are unpacked with numpy",
    )
    return BitmaskKernel(*loaded) if loaded else None
