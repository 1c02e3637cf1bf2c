"""Read element ranges of safetensors tensors with plain file reads, straight into a caller's buffer.

`safe_open` memory-maps the file; every page it touches then counts in the process's resident set
for as long as the file stays open, so reading a whole checkpoint piece by piece would grow RSS to
the checkpoint's size. Positioned reads keep memory at the size of the destination buffer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

import torch

from .source import CheckpointError

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class SafetensorsFile:
    """The header of one safetensors file and positioned reads of its tensors' elements."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._f: BinaryIO = open(self.path, "rb")
            (n,) = struct.unpack("<Q", self._f.read(8))
            size = self.path.stat().st_size
            if n > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(self._f.read(n))
        except (OSError, ValueError, struct.error, UnicodeDecodeError) as e:
            raise CheckpointError(f"{self.path} is not a readable safetensors file ({e}); restore it or use an earlier checkpoint")
        self.metadata = header.pop("__metadata__", {})
        self.tensors = header
        self._data_start = 8 + n
        for name, t in header.items():
            if t["data_offsets"][1] + self._data_start > size:
                raise CheckpointError(f"{self.path} is truncated (tensor {name} runs past the end); restore it or use an earlier checkpoint")

    def dtype(self, name: str) -> torch.dtype:
        return _DTYPES[self.tensors[name]["dtype"]]

    def numel(self, name: str) -> int:
        return int(torch.Size(self.tensors[name]["shape"]).numel())

    def read_into(self, name: str, start: int, out: torch.Tensor) -> None:
        """Fill flat, contiguous `out` with elements [start, start + out.numel()) of tensor `name`."""
        if name not in self.tensors:
            raise CheckpointError(f"{self.path} has no tensor {name!r}; the checkpoint does not match its manifest")
        dtype = self.dtype(name)
        if out.dtype != dtype or not out.is_contiguous():
            raise ValueError(f"read_into {name}: need a contiguous {dtype} buffer, got {out.dtype}")
        if start < 0 or start + out.numel() > self.numel(name):
            raise ValueError(f"read_into {name}: range [{start}, {start + out.numel()}) outside {self.numel(name)} elements")
        item = out.element_size()
        self._f.seek(self._data_start + self.tensors[name]["data_offsets"][0] + start * item)
        view = memoryview(out.view(torch.uint8).numpy()) if out.numel() else memoryview(b"")
        got = self._f.readinto(view) if out.numel() else 0
        if got != out.numel() * item:
            raise CheckpointError(f"{self.path} ended early reading {name}; the file is truncated")

    def read(self, name: str) -> torch.Tensor:
        """One whole tensor."""
        out = torch.empty(self.tensors[name]["shape"], dtype=self.dtype(name))
        self.read_into(name, 0, out.view(-1))
        return out

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
