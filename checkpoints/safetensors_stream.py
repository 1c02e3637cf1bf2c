"""Write a safetensors file piece by piece, hashing the bytes as they go out.

safetensors' own `save_file` needs every tensor at once and leaves hashing to a second read of the file.
The format is simple enough to stream: an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the raw little-endian bytes in header order. Files written
here load with `safe_open`. Large pieces go out in 16 MiB writes; each write overlaps the hashing of the
same bytes (both release the GIL). `align=4096` pads the header so the data starts on a page boundary
(checkpoint files: every large write is then page-aligned in the file).
"""

from __future__ import annotations

import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import torch

from . import checksums

_CODES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
WRITE_BYTES = 1 << 24


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor, without a copy when it is contiguous."""
    t = t.detach().contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


class StreamingWriter:
    """Declare every tensor up front, then `write` their elements in order, in as many pieces as you like.
    `close()` fsyncs and returns the file's manifest record (bytes and checksum)."""

    def __init__(
        self,
        path: str | Path,
        tensors: Sequence[tuple[str, torch.dtype, Sequence[int]]],
        metadata: dict[str, str] | None = None,
        align: int = 8,
        algorithm: str | None = None,
    ) -> None:
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
        raw += b" " * (-(8 + len(raw)) % align)  # the data starts aligned (safetensors itself keeps 8)
        self.path = Path(path)
        self.algorithm = algorithm or checksums.DEFAULT
        self._hasher = checksums.new_hasher(self.algorithm)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="zbench-write")
        self._written = 0
        self._emit(memoryview(struct.pack("<Q", len(raw)) + raw))
        self._index, self._left = 0, self._plan[0][2] if self._plan else 0
        self._advance()

    def _emit(self, data: memoryview) -> None:
        """Write `data` in large pieces, hashing each while the previous one is written."""
        pending = None
        for lo in range(0, len(data), WRITE_BYTES):
            piece = data[lo : lo + WRITE_BYTES]
            if pending is not None:
                pending.result()
            pending = self._pool.submit(_write_all, self._fd, piece)
            self._hasher.update(piece)
        if pending is not None:
            pending.result()
        self._written += len(data)

    @property
    def bytes_written(self) -> int:
        return self._written

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
        data = tensor_bytes(piece.cpu())  # a view of the tensor's own bytes: memory stays at the caller's buffer
        if data.nbytes > self._left:
            raise ValueError(f"{name}: {data.nbytes} bytes written past its declared size")
        self._emit(data)
        self._left -= data.nbytes
        self._advance()

    def close(self, fsync: bool = True) -> dict[str, Any]:
        """Check every declared byte was written, flush to disk; the file's record for a manifest."""
        try:
            if self._left != 0 or self._index + 1 < len(self._plan):
                raise ValueError(f"{self.path}: closed before every declared tensor was written")
            if fsync:
                os.fsync(self._fd)
        finally:
            self.abandon()
        return checksums.record(self.algorithm, self._hasher, self._written)

    def abandon(self) -> None:
        """Close without checks (after a failed write; the caller removes the file)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._pool.shutdown()


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], align: int = 4096) -> dict[str, Any]:
    """One safetensors file of whole CPU tensors, fsynced; its record (bytes and checksum)."""
    w = StreamingWriter(path, [(k, t.dtype, list(t.shape)) for k, t in tensors.items()], align=align)
    try:
        for t in tensors.values():
            w.write(t)
    except BaseException:
        w.abandon()
        raise
    return w.close()
