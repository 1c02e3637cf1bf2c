"""Read a file once, front to back, checking its checksum on the bytes that become tensors.

A load used to hash every file in a pass of its own and then read it again. Here the file is read in
large chunks into a few reusable aligned buffers (pinned when a destination is on a GPU), with O_DIRECT
where the filesystem allows it (direct_io.py; buffered otherwise) and several reads in flight; each chunk
is hashed in file order and its bytes copied to every destination range it overlaps (non-blocking to a
GPU). The digest is compared at the end: a damaged file raises CheckpointError once it has been read, so
a caller that must not be left half-loaded reads into buffers of its own first.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch

from . import direct_io
from .checksums import expected, new_hasher
from .source import CheckpointError

CHUNK_BYTES = 32 << 20  # one read (a multiple of direct_io.ALIGN)
BUFFERS = 4  # one being hashed and copied out, the others being read


class Span(NamedTuple):
    """Bytes [offset, offset + dst.numel()) of the file go into `dst` (a flat uint8 view, CPU or GPU)."""

    offset: int
    dst: torch.Tensor


def _buffers(spans: list[Span], size: int) -> list[torch.Tensor]:
    to_gpu = any(s.dst.is_cuda for s in spans)
    n = min(CHUNK_BYTES, direct_io.round_up(max(size, 1)))
    return [direct_io.aligned_buffer(n, pinned=to_gpu) for _ in range(min(BUFFERS, -(-size // n)))]


def _read_chunk(fd: int, buf: torch.Tensor, pos: int, n: int, ready: Any) -> int:
    if ready is not None:
        ready.synchronize()  # the GPU copies out of this buffer are done
    return direct_io.read_at(fd, memoryview(buf.numpy()), pos, n)


def read_verified(path: Path, entry: dict[str, Any], spans: list[Span]) -> None:
    """Fill every span from `path` in one sequential pass; CheckpointError if its size or checksum is off."""
    algorithm, digest = expected(entry)
    hasher = new_hasher(algorithm)
    spans = sorted((s for s in spans if s.dst.numel()), key=lambda s: s.offset)
    fd, _ = direct_io.open_file(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != entry["bytes"]:
            raise CheckpointError(
                f"{path} is truncated or padded ({size} bytes, manifest says {entry['bytes']}); "
                "restore it or load an earlier checkpoint"
            )
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        bufs = _buffers(spans, size)
        events: list[Any] = [None] * len(bufs)
        with ThreadPoolExecutor(max(1, len(bufs)), thread_name_prefix="zbench-read") as pool:
            reads: deque[tuple[Any, int, int, int]] = deque()  # (future, buffer, file offset, bytes), in file order
            nxt = 0
            for k, buf in enumerate(bufs):
                n = min(buf.numel(), size - nxt)
                reads.append((pool.submit(_read_chunk, fd, buf, nxt, n, None), k, nxt, n))
                nxt += n
            first = 0
            while reads:
                future, k, pos, n = reads.popleft()
                if future.result() != n:
                    raise CheckpointError(
                        f"{path} ended early while it was read; restore it or load an earlier checkpoint"
                    )
                chunk = bufs[k][:n]
                hasher.update(memoryview(chunk.numpy()))
                first, events[k] = _scatter(chunk, pos, spans, first)
                if nxt < size:  # this buffer's next read waits for its copies to the GPU, in the reading thread
                    m = min(bufs[k].numel(), size - nxt)
                    reads.append((pool.submit(_read_chunk, fd, bufs[k], nxt, m, events[k]), k, nxt, m))
                    nxt += m
        for ev in events:
            if ev is not None:
                ev.synchronize()
    finally:
        os.close(fd)
    if hasher.hexdigest() != digest:
        raise CheckpointError(
            f"{path} fails its {algorithm} checksum (corrupted); restore it or load an earlier checkpoint"
        )


def _scatter(chunk: torch.Tensor, pos: int, spans: list[Span], first: int) -> tuple[int, Any]:
    """Copy the chunk's bytes [pos, pos + len) into the spans overlapping it; spans before `first` are done."""
    end = pos + chunk.numel()
    gpu = False
    while first < len(spans) and spans[first].offset + spans[first].dst.numel() <= pos:
        first += 1
    for s in spans[first:]:
        if s.offset >= end:
            break
        lo, hi = max(pos, s.offset), min(end, s.offset + s.dst.numel())
        if lo < hi:
            s.dst[lo - s.offset : hi - s.offset].copy_(chunk[lo - pos : hi - pos], non_blocking=s.dst.is_cuda)
            gpu |= s.dst.is_cuda
    if not gpu:
        return first, None
    event = torch.cuda.Event()
    event.record()
    return first, event
