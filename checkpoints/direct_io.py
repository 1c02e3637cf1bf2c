"""O_DIRECT file I/O for checkpoints, with a buffered fallback where the filesystem refuses it.

Checkpoint files are written once and read once, so the page cache only gets in the way: buffered writes
fill it with dirty pages that the kernel throttles and writes back behind the writer's back, and reads copy
every byte once more. O_DIRECT moves the bytes between the device and the caller's buffers. It needs the
buffer's address, the file offset and the length to be multiples of the logical block size (4096 covers
512- and 4096-byte devices); the callers stage data through buffers from `aligned_buffer` and do I/O at
aligned offsets. A filesystem that refuses O_DIRECT says so with EINVAL, at open (tmpfs before Linux 6.6,
some FUSE and overlay setups) or at the first transfer; the file then carries on buffered, same bytes.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import torch

ALIGN = 4096
_DIRECT = getattr(os, "O_DIRECT", 0)


def round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """A uint8 tensor of `nbytes` (a multiple of ALIGN) whose address is ALIGN-aligned; page-locked if `pinned`."""
    assert nbytes % ALIGN == 0, nbytes
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    if buf.data_ptr() % ALIGN == 0:  # pinned and large allocations usually are
        return buf
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pinned)
    skip = -raw.data_ptr() % ALIGN
    return raw[skip : skip + nbytes]  # the slice keeps the whole allocation alive


def open_file(path: Path, flags: int) -> tuple[int, bool]:
    """(fd, whether O_DIRECT is on) for `path`; buffered when the filesystem refuses O_DIRECT."""
    if _DIRECT:
        try:
            return os.open(path, flags | _DIRECT, 0o644), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def go_buffered(fd: int) -> None:
    """Turn O_DIRECT off on an open file (the filesystem took the open but refuses direct transfers)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_DIRECT)


def is_direct(fd: int) -> bool:
    return bool(_DIRECT) and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & _DIRECT)


def write_at(fd: int, data: memoryview, offset: int) -> None:
    """Write all of `data` at `offset`. Under O_DIRECT both must be aligned; a refusal turns O_DIRECT off."""
    while data:
        direct = is_direct(fd)  # as of this call: another thread's refusal may turn it off before we look again
        try:
            k = os.pwrite(fd, data, offset)
        except OSError as e:
            if e.errno != errno.EINVAL or not direct:
                raise
            go_buffered(fd)
            continue
        data, offset = data[k:], offset + k


def read_at(fd: int, buf: memoryview, offset: int, nbytes: int) -> int:
    """Read up to `nbytes` at `offset` into `buf` (at least round_up(nbytes) long); how many bytes came (fewer
    only at the end of the file). Under O_DIRECT the request is rounded up to whole blocks."""
    got = 0
    while got < nbytes:
        direct = is_direct(fd)
        want = round_up(nbytes) if direct else nbytes
        try:
            k = os.preadv(fd, [buf[got:want]], offset + got)
        except OSError as e:
            if e.errno != errno.EINVAL or not direct:
                raise
            go_buffered(fd)
            continue
        if k == 0 or (direct and k % ALIGN):  # O_DIRECT returns a partial block only at the end of the file
            return min(got + k, nbytes)
        got += k
    return min(got, nbytes)
