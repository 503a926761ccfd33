"""A GGUF file's scalar metadata and tensor table, read without decoding its large arrays.

The `gguf` package's reader builds a numpy view for every element of every metadata array, which for a
model's tokenizer (about 100,000 strings) takes seconds at each load. The engine needs a few scalars and the
tensor table only, so this reader walks the header once, skips arrays by their lengths and maps the tensor
data from the file. Layout (GGUF v2 and v3): magic, version, tensor count, metadata count, the metadata
key-value pairs, the tensor infos, then the data at the file's alignment.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vriksha.errors import ModelLoadError

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # innermost dimension first, as GGUF lists them
    type_name: str  # GGML type, for example "Q4_1"
    data: np.ndarray  # the tensor's bytes, mapped from the file (uint8)


@dataclass(frozen=True)
class GGUFIndex:
    metadata: dict[str, int | float | bool | str]  # scalar and string values; arrays are skipped
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buffer: memoryview, path: Path) -> None:
        self.buffer, self.offset, self.path = buffer, 0, path

    def take(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        except struct.error as exc:
            raise ModelLoadError(f"{self.path}: the GGUF header ends early at byte {self.offset}") from exc
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise ModelLoadError(f"{self.path}: a GGUF string runs past the end of the file")
        text = bytes(self.buffer[self.offset : end]).decode("utf-8", errors="replace")
        self.offset = end
        return text

    def skip_value(self, value_type: int) -> None:
        if value_type == _STRING:
            length = self.take("<Q")
            self.offset += length
        elif value_type == _ARRAY:
            element_type, count = self.take("<I"), self.take("<Q")
            if element_type in _SCALARS:
                self.offset += count * struct.calcsize(_SCALARS[element_type])
            elif element_type == _STRING:
                for _ in range(count):
                    length = self.take("<Q")
                    self.offset += length
            else:
                for _ in range(count):
                    self.skip_value(element_type)
        elif value_type in _SCALARS:
            self.offset += struct.calcsize(_SCALARS[value_type])
        else:
            raise ModelLoadError(
                f"{self.path}: unknown GGUF metadata type {value_type} at byte {self.offset}"
            )

    def value(self, value_type: int):
        if value_type == _STRING:
            return self.string()
        if value_type in _SCALARS:
            return self.take(_SCALARS[value_type])
        self.skip_value(value_type)
        return None


def read_gguf_index(path: Path) -> GGUFIndex:
    """The scalar metadata and the tensor table of the GGUF file at `path`."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not map the GGUF file {path}: {exc}") from exc
    cursor = _Cursor(memoryview(mapped), path)
    if bytes(mapped[:4]) != _MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (its first bytes are {bytes(mapped[:4])!r})")
    cursor.offset = 4
    version = cursor.take("<I")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
    metadata: dict = {}
    for _ in range(kv_count):
        key = cursor.string()
        value = cursor.value(cursor.take("<I"))
        if value is not None:
            metadata[key] = value
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        shape = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
        type_id, offset = cursor.take("<I"), cursor.take("<Q")
        infos.append((name, shape, type_id, offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = -(-cursor.offset // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in infos:
        try:
            ggml_type = GGMLQuantizationType(type_id)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: tensor {name} has unknown GGML type {type_id}") from exc
        block, block_bytes = GGML_QUANT_SIZES[ggml_type]
        elements = int(np.prod(shape)) if shape else 1
        start = data_start + offset
        end = start + elements // block * block_bytes
        if end > len(mapped):
            raise ModelLoadError(f"{path}: tensor {name} runs past the end of the file (truncated download?)")
        tensors.append(GGUFTensor(name, shape, ggml_type.name, mapped[start:end]))
    return GGUFIndex(metadata, tensors)
