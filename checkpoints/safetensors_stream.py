"""Write a safetensors file piece by piece, hashing the bytes as they go out.

safetensors' own `save_file` needs every tensor at once and leaves hashing to a second read of the file.
The format is simple enough to stream: an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the raw little-endian bytes in header order. Files written
here load with `safe_open`. The bytes go out through a small ring of aligned buffers, with O_DIRECT where
the filesystem allows it (staged_write.py); pieces may be CPU or GPU tensors (a GPU piece is copied to the
host a buffer at a time). `align=4096` pads the header so the data starts on a page boundary.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Sequence

import torch

from . import checksums
from .dtypes import code_of
from .staged_write import StagedWriter



def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor as a flat uint8 tensor on its device, without a copy when it is contiguous."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class StreamingWriter:
    """Declare every tensor up front, then `write` their elements in order, in as many pieces as you like.
    `close()` fsyncs and returns the file's manifest record (bytes and checksum). `pinned`: the pieces come
    from a GPU, so the staging buffers are page-locked."""

    def __init__(
        self,
        path: str | Path,
        tensors: Sequence[tuple[str, torch.dtype, Sequence[int]]],
        metadata: dict[str, str] | None = None,
        align: int = 8,
        algorithm: str | None = None,
        pinned: bool = False,
    ) -> None:
        header: dict[str, object] = {}
        offset = 0
        self._plan: list[tuple[str, torch.dtype, int]] = []
        for name, dtype, shape in tensors:
            nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": code_of(dtype, name), "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self._plan.append((name, dtype, nbytes))
            offset += nbytes
        if metadata:
            header["__metadata__"] = metadata
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % align)  # the data starts aligned (safetensors itself keeps 8)
        head = struct.pack("<Q", len(raw)) + raw
        self.path = Path(path)
        self.algorithm = algorithm or checksums.DEFAULT
        self._hasher = checksums.new_hasher(self.algorithm)
        # page-locked ring buffers only for GPU sources: pinning needs a CUDA context, which a CPU-only user of this
        # writer (a convert on a GPU node, the NVMe states, async copies already on the host) must not create
        self._out = StagedWriter(self.path, self._hasher, len(head) + offset, pinned=pinned)
        self._out.append(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        self._index, self._left = 0, self._plan[0][2] if self._plan else 0
        self._advance()

    @property
    def bytes_written(self) -> int:
        """Bytes handed to the file so far (header included); on disk once `close()` returns."""
        return self._out.appended

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
        data = flat_bytes(piece)  # a view of the tensor's own bytes, on its device: staged a buffer at a time
        if data.numel() > self._left:
            raise ValueError(f"{name}: {data.numel()} bytes written past its declared size")
        self._out.append(data)
        self._left -= data.numel()
        self._advance()

    def close(self, fsync: bool = True) -> dict[str, Any]:
        """Check every declared byte was written, flush to disk; the file's record for a manifest."""
        try:
            if self._left != 0 or self._index + 1 < len(self._plan):
                raise ValueError(f"{self.path}: closed before every declared tensor was written")
            size = self._out.finish(fsync)
        finally:
            self.abandon()
        return checksums.record(self.algorithm, self._hasher, size)

    def abandon(self) -> None:
        """Close without checks (after a failed write; the caller removes the file)."""
        self._out.abandon()


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], align: int = 4096) -> dict[str, Any]:
    """One safetensors file of whole tensors (CPU or GPU, streamed), fsynced; its record (bytes and checksum)."""
    pinned = any(t.is_cuda for t in tensors.values())
    w = StreamingWriter(path, [(k, t.dtype, list(t.shape)) for k, t in tensors.items()], align=align, pinned=pinned)
    try:
        for t in tensors.values():
            w.write(t)
    except BaseException:
        w.abandon()
        raise
    return w.close()
