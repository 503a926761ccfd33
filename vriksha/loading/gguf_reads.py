"""Transformers' GGUF conversion with the file parsed once instead of once per part, and its blocks
dequantized by torch.

For the architectures its newer reader does not cover (Llama among them), Transformers reads a GGUF through
the `gguf` package: the config, the tokenizer and the weights each build their own `gguf.GGUFReader`, which
makes a numpy view of every element of the tokenizer's arrays (about 100,000 strings, 6-7 s a parse on a
Zen 1 core), and the weights' name mapping rebuilds `gguf.get_tensor_name_map(arch, layers)` for every
tensor (about 400 calls of 18 ms). Both are pure functions of their arguments, and the reader only reads
(a read-only memory map), so while converting, the `gguf` module hands out one reader per file and one map
per architecture and layer count. The embedded model converts in about 22 s instead of 46 s on a Zen 1, to
byte-identical files.

The weights themselves are dequantized by `gguf.dequantize`, numpy code on one core (3 to 20 million weights
a second for Q5_0 and the K-quants on a Zen 3 core); within the block it is `ggml_blocks.dequantize_like_gguf`,
the same values bit for bit from torch (20 to 30 times that for the legacy formats, 2 to 4 times for the
K-quants), so the 0.5B Qwen2.5 model's conversion does not spend a minute in numpy.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from vriksha.loading.ggml_blocks import dequantize_like_gguf

_LOCK = threading.Lock()  # the patch is process-wide: one conversion at a time


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within this block the `gguf` package's reader and tensor-name map are built once per argument set, and
    `gguf.dequantize` is torch's (`ggml_blocks.dequantize_like_gguf`)."""
    try:
        import gguf
    except ImportError:  # Transformers names the missing package itself
        yield
        return
    with _LOCK:
        reader_class = getattr(gguf, "GGUFReader", None)
        name_map = getattr(gguf, "get_tensor_name_map", None)
        dequantize = getattr(gguf, "dequantize", None)
        readers: dict[tuple[str, str], Any] = {}

        def shared_reader(path: Any, mode: str = "r") -> Any:
            if mode != "r":
                return reader_class(path, mode)
            key = (str(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)
            return readers[key]

        if reader_class is not None:
            gguf.GGUFReader = shared_reader
        if name_map is not None:
            gguf.get_tensor_name_map = functools.cache(name_map)
        if dequantize is not None:
            gguf.dequantize = dequantize_like_gguf
        try:
            yield
        finally:
            if reader_class is not None:
                gguf.GGUFReader = reader_class
            if name_map is not None:
                gguf.get_tensor_name_map = name_map
            if dequantize is not None:
                gguf.dequantize = dequantize
            readers.clear()
