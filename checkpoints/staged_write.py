"""Write a file's bytes through a small ring of aligned buffers: O_DIRECT at the disk's speed, hashed on the way.

The caller appends flat uint8 tensors (CPU or GPU, any length). Their bytes are copied into the next ring
buffer (from a GPU on a side stream, into pinned memory); a full buffer is hashed in file order and handed to
a writer thread, which writes it at its aligned file offset while the next buffers fill, WRITES_IN_FLIGHT at
a time. Memory stays at RING buffers whatever the file's size: a tensor is never copied to the host whole.
The last buffer is written padded to a whole block and the file cut back to its exact length. Where the
filesystem refuses O_DIRECT the same buffers are written buffered (direct_io.py); the bytes are identical.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from . import direct_io
from .checksums import Hasher

PIECE_BYTES = 32 << 20  # one write from a GPU source: large enough for full device bandwidth
HOST_PIECE_BYTES = 8 << 20  # from host memory: already at disk speed with two in flight, and 96 MiB less RSS
RING = 4  # buffers: one filling, the rest being written
WRITES_IN_FLIGHT = 2


class StagedWriter:
    """Append bytes in order; `finish()` returns the byte count once everything is on disk (fsynced)."""

    def __init__(self, path: Path, hasher: Hasher, size_hint: int, pinned: bool) -> None:
        self._fd, self.direct = direct_io.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._hasher = hasher
        self._piece = min(PIECE_BYTES if pinned else HOST_PIECE_BYTES, direct_io.round_up(max(size_hint, 1)))
        self._bufs: list[torch.Tensor] = []
        self._inflight: deque[tuple[Future, torch.Tensor]] = deque()
        self._pool = ThreadPoolExecutor(WRITES_IN_FLIGHT, thread_name_prefix="zbench-write")
        self._cur: torch.Tensor | None = None
        self._fill = 0  # bytes staged in the current buffer
        self._start = 0  # file offset of the current buffer
        self._padded = False  # a block-padded tail went out: the file must be cut back
        self._stream: Any = None  # side stream of the device-to-host copies
        self._pinned = pinned  # page-locked buffers: device-to-host copies at full speed, asynchronously

    @property
    def appended(self) -> int:
        return self._start + self._fill

    def append(self, data: torch.Tensor) -> None:
        """Stage the bytes of a flat uint8 tensor (CPU or GPU) after those appended before."""
        assert data.dtype == torch.uint8 and data.dim() == 1, (data.dtype, data.shape)
        gpu = data.is_cuda
        pos, n = 0, data.numel()
        while pos < n:
            if self._cur is None:
                self._cur = self._take()
            k = min(n - pos, self._cur.numel() - self._fill)
            dst, src = self._cur[self._fill : self._fill + k], data[pos : pos + k]
            if gpu:
                self._copy_from_gpu(dst, src)
            else:
                dst.copy_(src)
            self._fill += k
            pos += k
            if self._fill == self._cur.numel():
                self._send()
        if gpu and self._stream is not None:
            self._stream.synchronize()  # the caller may reuse `data` once this returns

    def _copy_from_gpu(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=src.device)
        self._stream.wait_stream(torch.cuda.current_stream(src.device))  # after the work that produced `src`
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)

    def _take(self) -> torch.Tensor:
        """A free ring buffer: a new one while the ring is not full, else the oldest once its write is done."""
        if len(self._bufs) < RING:
            self._bufs.append(direct_io.aligned_buffer(self._piece, self._pinned))
            return self._bufs[-1]
        future, buf = self._inflight.popleft()
        future.result()  # a failed write raises here, in the caller's thread
        return buf

    def _send(self) -> None:
        """Hash the current buffer's staged bytes and queue their write."""
        assert self._cur is not None
        if self._stream is not None:
            self._stream.synchronize()
        staged = self._cur[: self._fill]
        self._hasher.update(memoryview(staged.numpy()))
        out = staged
        if self.direct and self._fill % direct_io.ALIGN:  # only the file's last piece is short
            end = direct_io.round_up(self._fill)
            self._cur[self._fill : end].zero_()
            out, self._padded = self._cur[:end], True
        self._inflight.append(
            (self._pool.submit(direct_io.write_at, self._fd, memoryview(out.numpy()), self._start), self._cur)
        )
        self._start += self._fill
        self._cur, self._fill = None, 0

    def finish(self, fsync: bool = True) -> int:
        """Write what is staged, wait for every write, cut the padding, fsync; the file's size."""
        try:
            if self._fill:
                self._send()
            while self._inflight:
                self._inflight.popleft()[0].result()
            if self._padded:
                os.ftruncate(self._fd, self._start)
            if fsync:
                os.fsync(self._fd)
        finally:
            self.abandon()
        return self._start

    def abandon(self) -> None:
        """Close without finishing (after a failure; the caller removes the file). Waits for writes in flight:
        the descriptor must not be closed under them."""
        if self._fd < 0:
            return
        for future, _ in self._inflight:
            future.exception()
        self._inflight.clear()
        self._pool.shutdown()
        os.close(self._fd)
        self._fd = -1
        self._bufs.clear()
