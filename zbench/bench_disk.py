"""The disk's floor for checkpoint I/O: sequential O_DIRECT writes (fsynced) and reads of one large file.

O_DIRECT bypasses the page cache, so the numbers are the device's, not memory's. Where the filesystem
refuses O_DIRECT (tmpfs, some overlays), buffered I/O with fsync, and the file's pages dropped before the
read, stand in; the result says which was used.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

from checkpoints.direct_io import open_file

CHUNK = 1 << 24  # 16 MiB, a multiple of any logical block size


def drop_cached(paths: list[Path]) -> None:
    """Evict these files' pages from the page cache (a cold read follows); needs no privileges."""
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_floor(folder: Path, nbytes: int) -> dict[str, float | bool]:
    """GB/s of a fsynced sequential write and a cold sequential read of `nbytes` (rounded up to 16 MiB)."""
    path = folder / ".zbench-disk-floor"
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(1 << 20) * (CHUNK >> 20))
    chunks = max(1, -(-nbytes // CHUNK))
    try:
        fd, direct = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        t = time.perf_counter()
        try:
            for _ in range(chunks):
                os.write(fd, buf)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - t
        if not direct:
            drop_cached([path])
        fd, direct_read = open_file(path, os.O_RDONLY)
        t = time.perf_counter()
        try:
            while os.readv(fd, [buf]) > 0:
                pass
        finally:
            os.close(fd)
        read_s = time.perf_counter() - t
    finally:
        path.unlink(missing_ok=True)
        buf.close()
    size = chunks * CHUNK
    return {"write_gbs": size / write_s / 1e9, "read_gbs": size / read_s / 1e9, "o_direct": direct and direct_read}
