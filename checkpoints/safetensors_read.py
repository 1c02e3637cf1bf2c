"""Read element ranges of safetensors tensors with plain file reads, straight into a caller's buffer.

`safe_open` memory-maps the file; every page it touches then counts in the process's resident set
for as long as the file stays open, so reading a whole checkpoint piece by piece would grow RSS to
the checkpoint's size. Positioned reads keep memory at the size of the destination buffer.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import BinaryIO

import torch

from .dtypes import ITEM_BYTES, SAFETENSORS
from .source import CheckpointError



MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


def header_problem(header: object, data_bytes: int) -> str | None:
    """What is wrong with a parsed safetensors header for a data section of `data_bytes`, or None: every
    entry a known dtype, a shape of non-negative ints, offsets that match dtype x shape and fill the data section
    exactly (no overlap, gap or trailing byte); `__metadata__` text to text."""
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        return "its __metadata__ is not text to text"
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not (
            isinstance(t, dict)
            and isinstance(t.get("dtype"), str)
            and t["dtype"] in ITEM_BYTES
            and isinstance(t.get("shape"), list)
            and len(t["shape"]) <= 32
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in t["shape"])
            and isinstance(t.get("data_offsets"), list)
            and len(t["data_offsets"]) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in t["data_offsets"])
        ):
            return f"tensor {str(name)[:60]!r} has a malformed header entry"
        a, b = t["data_offsets"]
        n = 1
        for d in t["shape"]:
            n *= d
        if 0 <= a <= b and b - a == n * ITEM_BYTES[t["dtype"]] and b > data_bytes:
            return f"the file is truncated: tensor {str(name)[:60]!r} runs past its end"
        if not 0 <= a <= b <= data_bytes or b - a != n * ITEM_BYTES[t["dtype"]]:
            return f"tensor {str(name)[:60]!r} has offsets {a}..{b} that do not fit its shape or the file"
        spans.append((a, b))
    return _extent_problem(sorted(spans), data_bytes)


def _extent_problem(spans: list[tuple[int, int]], data_bytes: int) -> str | None:
    """safetensors' data section is exactly its tensors, back to back (its own reader refuses anything else): a
    gap between them or bytes after the last are no part of the format, so whoever put them there changed the
    file after it was written."""
    pos = 0
    for a, b in spans:
        if a < pos:
            return "two tensors overlap in the file"
        if a > pos:
            return f"{a - pos} bytes at data offset {pos} belong to no tensor: the file was damaged or altered"
        pos = b
    if pos != data_bytes:
        return f"{data_bytes - pos} bytes follow the last tensor's data: the file was damaged or altered"
    return None


class SafetensorsFile:
    """The header of one safetensors file and positioned reads of its tensors' elements."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._f: BinaryIO = open(self.path, "rb")
        except OSError as e:
            raise CheckpointError(
                f"{self.path} cannot be opened ({e.strerror}); restore it or use an earlier checkpoint"
            ) from None
        try:
            size = os.fstat(self._f.fileno()).st_size
            (n,) = struct.unpack("<Q", self._f.read(8))
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise ValueError("header longer than the file or than safetensors allows")
            header = json.loads(self._f.read(n))
            problem = header_problem(header, size - 8 - n)
        except (OSError, ValueError, struct.error, UnicodeDecodeError, RecursionError) as e:
            self._f.close()
            raise CheckpointError(
                f"{self.path} is not a readable safetensors file ({e.__class__.__name__}: {str(e)[:80]}); "
                "restore it or use an earlier checkpoint"
            ) from None
        if problem:
            self._f.close()
            raise CheckpointError(
                f"{self.path} is not a valid safetensors file ({problem}); restore it or use an earlier checkpoint"
            )
        self.metadata = header.pop("__metadata__", {})
        self.tensors = header
        self._data_start = 8 + n

    def dtype(self, name: str) -> torch.dtype:
        return SAFETENSORS[self.tensors[name]["dtype"]]

    def numel(self, name: str) -> int:
        return int(torch.Size(self.tensors[name]["shape"]).numel())

    def byte_offset(self, name: str, start: int) -> int:
        """Where element `start` of tensor `name` lies in the file."""
        return (
            self._data_start
            + self.tensors[name]["data_offsets"][0]
            + start * torch.empty((), dtype=self.dtype(name)).element_size()
        )

    def read_into(self, name: str, start: int, out: torch.Tensor) -> None:
        """Fill flat, contiguous `out` with elements [start, start + out.numel()) of tensor `name`."""
        if name not in self.tensors:
            raise CheckpointError(f"{self.path} has no tensor {name!r}; the checkpoint does not match its manifest")
        dtype = self.dtype(name)
        if out.dtype != dtype or not out.is_contiguous():
            raise ValueError(f"read_into {name}: need a contiguous {dtype} buffer, got {out.dtype}")
        if start < 0 or start + out.numel() > self.numel(name):
            raise ValueError(
                f"read_into {name}: range [{start}, {start + out.numel()}) outside {self.numel(name)} elements"
            )
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
