"""How many bytes each side copied during one update (every explicit copy of tensor data is counted)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class CopyCounter:
    bytes_copied: int = 0  # bytes written by explicit copies (pack into a buffer, copy into parameters)
    copies: int = 0  # number of tensor copies
    bytes_moved: int = 0  # bytes that crossed the data plane (socket, shared mapping, file)

    def add(self, nbytes: int) -> None:
        self.bytes_copied += nbytes
        self.copies += 1

    def to_json(self) -> dict:
        return asdict(self)
