"""Write a safetensors file piece by piece, so a file larger than memory never sits in memory.

safetensors' own `save_file` needs every tensor at once. The format is simple enough to stream: an
8-byte little-endian header length, a JSON header giving each tensor's dtype, shape and byte range,
then the raw little-endian bytes in header order. Files written here load with `safe_open`.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import BinaryIO, Sequence

import torch

_CODES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


class StreamingWriter:
    """Declare every tensor up front, then `write` their elements in order, in as many pieces as you like."""

    def __init__(self, path: str | Path, tensors: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, object] = {}
        offset = 0
        self._plan: list[tuple[str, torch.dtype, int]] = []
        for name, dtype, shape in tensors:
            nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._plan.append((name, dtype, nbytes))
            offset += nbytes
        if metadata:
            header["__metadata__"] = metadata
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as safetensors itself does
        self.path = Path(path)
        self._f: BinaryIO = open(self.path, "wb")
        self._f.write(struct.pack("<Q", len(raw)) + raw)
        self._index, self._left = 0, self._plan[0][2] if self._plan else 0
        self._advance()

    def _advance(self) -> None:
        """Skip past finished (and empty) tensors."""
        while self._left == 0 and self._index + 1 < len(self._plan):
            self._index += 1
            self._left = self._plan[self._index][2]

    def write(self, piece: torch.Tensor) -> None:
        """Append the next elements of the current tensor (dtype must match the declaration)."""
        name, dtype, _ = self._plan[self._index]
        if piece.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype}, got {piece.dtype}")
        # a view of the tensor's own bytes: no copy, so memory stays at the caller's buffer
        data = memoryview(piece.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
        if data.nbytes > self._left:
            raise ValueError(f"{name}: {data.nbytes} bytes written past its declared size")
        self._f.write(data)
        self._left -= data.nbytes
        self._advance()

    def close(self) -> None:
        """Check every declared byte was written, then flush to disk."""
        if self._left != 0 or self._index + 1 < len(self._plan):
            self._f.close()
            raise ValueError(f"{self.path}: closed before every declared tensor was written")
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
