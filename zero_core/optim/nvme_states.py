"""Optimizer states on NVMe: one preallocated file per rank, streamed in large chunks on an I/O thread pool.

File layout: chunk i of the partition is one record [master | exp_avg | exp_avg_sq] of `chunk` elements
each (the last record: its length rounded up to 1024 elements), at byte offset i * 3 * chunk * 4.
Every offset and length is a multiple of 4 KiB, so the file is opened with O_DIRECT (no page cache:
the disk, not spare host memory, holds the states) where the file system allows it, else buffered.

`stream()` keeps `buffer_count` chunk buffers in host memory: while the caller updates chunk i, the
next `buffer_count - 2` chunks are being read and the previous ones written back. Each chunk read or
write is split into `block_size` requests run by `thread_count * queue_depth` threads (blocking
pread/pwrite release the GIL; Python has no libaio), so that many requests are in flight at once.

The file is unlinked right after it is created: it has no name, and the kernel frees its space when
the process ends, however it ends (close(), exit, crash or kill -9). It never outlives the run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .nvme_writer import NvmeWriter
from .states import NAMES, Views

ALIGN = 1024  # elements (4 KiB of fp32): O_DIRECT's offset/length unit, and a multiple of any vector width
# 4 Mi elements = 16 MiB per state per request: far past the ~1 MiB where an NVMe drive reaches its
# sequential bandwidth, while 4 buffers of 3 states stay at 192 MiB of host memory per rank
NVME_CHUNK_NUMEL = 4 << 20


def round_up(n: int, multiple: int = ALIGN) -> int:
    return -(-n // multiple) * multiple


def chunk_numel_from_env(default: int, var: str) -> int:
    """`default`, or the env var's value rounded up to whole 1024-element units (for tuning and tests)."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{var}={raw!r} must be a positive number of elements")
    return round_up(int(raw))


def file_bytes(numel: int, chunk: int) -> int:
    """Size of the state file of a `numel`-element partition."""
    if numel == 0:
        return 0
    full, last = divmod(numel, chunk)
    return 3 * 4 * (full * chunk + (round_up(last) if last else 0))


def check_path(
    folder: str, needed: int, local_world: int, section: str = "offload_optimizer", what_needs: str = "optimizer states"
) -> str | None:
    """The one-line problem with using `folder` for `needed` bytes per rank (None when fine)."""
    where = f"zero_optimization.{section}.nvme_path '{folder}'"
    if not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        return f"{where} {what}; create it (a directory on a fast local disk) or fix the path"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{where} is not writable by this process; make it writable or point nvme_path elsewhere"
    free = shutil.disk_usage(folder).free
    total = needed * local_world
    if free < total:
        return (
            f"{where} has {free:,} bytes free but {what_needs} need {total:,} bytes "
            f"({needed:,} per rank x {local_world} rank(s) on this host); "
            "free space or point nvme_path at a larger disk"
        )
    return None


def _aligned(nbytes: int) -> torch.Tensor:
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    shift = (-raw.data_ptr()) % 4096
    return raw[shift : shift + nbytes]


class NvmeStates:
    def __init__(
        self,
        numel: int,
        folder: str,
        rank: int,
        *,
        chunk: int = NVME_CHUNK_NUMEL,
        buffer_count: int = 4,
        block_size: int = 1 << 20,
        queue_depth: int = 8,
        thread_count: int = 1,
    ) -> None:
        assert chunk % ALIGN == 0 and block_size % 4096 == 0 and buffer_count >= 2
        self.numel, self.chunk, self.block = numel, chunk, block_size
        self.device, self.names = torch.device("cpu"), NAMES
        self.nchunks = -(-numel // chunk)
        self.nbytes = file_bytes(numel, chunk)
        self.wait_seconds = 0.0  # time callers spent blocked on I/O (the step's nvme_wait)
        self.path = os.path.join(folder, f"zero_core-{socket.gethostname()}-pid{os.getpid()}-rank{rank}.optim")
        self.fd = -1
        self._pool: ThreadPoolExecutor | None = None
        self.buffers: list[torch.Tensor] = []
        try:
            self.fd, self.direct = self._open()
            self._allocate()
        except OSError as e:
            self.close()
            raise ValueError(
                f"cannot create the NVMe optimizer-state file in '{folder}' ({e.strerror or e}); "
                "check the path, its permissions and free space"
            ) from None
        self._pool = ThreadPoolExecutor(max(1, thread_count * queue_depth), thread_name_prefix="zero_core-nvme")
        self.buffers = [_aligned(3 * 4 * min(chunk, round_up(numel))) for _ in range(buffer_count)]
        self._scratch: tuple[int, str, torch.Tensor] | None = None  # read(): the last region read, for reuse

    # -- set-up ------------------------------------------------------------------------------------
    def _open(self) -> tuple[int, bool]:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        direct = getattr(os, "O_DIRECT", 0)
        if direct:
            try:
                fd = os.open(self.path, flags | direct, 0o600)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
            else:
                try:  # some file systems accept the flag and refuse the I/O
                    probe = _aligned(4096)
                    os.pwrite(fd, memoryview(probe.numpy()), 0)
                    os.unlink(self.path)
                    return fd, True
                except OSError:
                    os.close(fd)
                    os.unlink(self.path)
        fd = os.open(self.path, flags, 0o600)
        os.unlink(self.path)
        return fd, False

    def _allocate(self) -> None:
        if self.nbytes == 0:
            return
        try:
            os.posix_fallocate(self.fd, 0, self.nbytes)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise OSError(e.errno, f"no space left for {self.nbytes:,} bytes") from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                raise
            os.ftruncate(self.fd, self.nbytes)  # no preallocation on this file system: sparse

    # -- I/O ---------------------------------------------------------------------------------------
    def _record(self, i: int) -> tuple[int, int, int, int]:
        """(lo, hi, stride, byte offset) of chunk i: elements [lo, hi), each state region `stride` long."""
        lo = i * self.chunk
        hi = min(self.numel, lo + self.chunk)
        return lo, hi, round_up(hi - lo), 3 * 4 * lo

    def _views(self, buf: torch.Tensor, i: int, names: tuple[str, ...]) -> Views:
        lo, hi, stride, _ = self._record(i)
        flat = buf[: 3 * 4 * stride].view(torch.float32)
        return {n: flat[NAMES.index(n) * stride : NAMES.index(n) * stride + hi - lo] for n in names}

    def _ranges(self, i: int, names: tuple[str, ...]) -> list[tuple[int, int, int]]:
        """(file offset, buffer offset, length) in bytes for the regions of `names`, merged where adjacent."""
        _, _, stride, off = self._record(i)
        out: list[tuple[int, int, int]] = []
        for k in sorted(NAMES.index(n) for n in names):
            start, length = 4 * k * stride, 4 * stride
            if out and out[-1][1] + out[-1][2] == start:
                out[-1] = (out[-1][0], out[-1][1], out[-1][2] + length)
            else:
                out.append((off + start, start, length))
        return out

    def _submit(self, write: bool, i: int, buf: torch.Tensor, names: tuple[str, ...]) -> list[Future]:
        assert self._pool is not None, "the NVMe state file is closed"
        mv = memoryview(buf.numpy())
        futures = []
        for file_off, buf_off, length in self._ranges(i, names):
            for b in range(0, length, self.block):
                n = min(self.block, length - b)
                futures.append(self._pool.submit(_io, self.fd, write, mv[buf_off + b : buf_off + b + n], file_off + b))
        return futures

    def _wait(self, futures: list[Future]) -> None:
        start = time.perf_counter()
        try:
            for f in futures:
                f.result()
        except OSError as e:
            raise OSError(
                e.errno,
                f"NVMe offload: I/O on the optimizer-state file in {os.path.dirname(self.path)} "
                f"failed ({e.strerror or e})",
            ) from None
        finally:
            self.wait_seconds += time.perf_counter() - start

    # -- the three ways in -------------------------------------------------------------------------
    def stream(self, names: tuple[str, ...] = NAMES, write_back: bool = True) -> Iterator[tuple[int, int, Views]]:
        """Chunk by chunk: (lo, hi, views of `names` for elements [lo, hi)); views edited by the caller
        are written back (`write_back`) after it asks for the next chunk."""
        count = len(self.buffers)
        depth = max(1, count - 2)
        reads: dict[int, list[Future]] = {}
        writes: dict[int, list[Future]] = {}
        issued = 0
        try:
            for i in range(self.nchunks):
                while issued < self.nchunks and issued <= i + depth:
                    if issued - count in writes:  # its buffer's previous chunk must be on disk first
                        self._wait(writes.pop(issued - count))
                    reads[issued] = self._submit(False, issued, self.buffers[issued % count], names)
                    issued += 1
                self._wait(reads.pop(i))
                lo, hi, _, _ = self._record(i)
                yield lo, hi, self._views(self.buffers[i % count], i, names)
                if write_back:
                    writes[i] = self._submit(True, i, self.buffers[i % count], names)
        finally:
            for fs in list(reads.values()) + list(writes.values()):
                self._wait(fs)
            if write_back:
                self._scratch = None

    def read(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """A copy of state `name`'s elements [lo, hi)."""
        out = torch.empty(hi - lo, dtype=torch.float32)
        pos = lo
        while pos < hi:
            i = pos // self.chunk
            if self._scratch is None or self._scratch[:2] != (i, name):
                buf = self._scratch[2] if self._scratch is not None else _aligned(3 * 4 * self.chunk)
                self._wait(self._submit(False, i, buf, (name,)))
                self._scratch = (i, name, buf)
            rlo, rhi, _, _ = self._record(i)
            take = min(hi, rhi) - pos
            out[pos - lo : pos - lo + take].copy_(
                self._views(self._scratch[2], i, (name,))[name][pos - rlo : pos - rlo + take]
            )
            pos += take
        return out

    def writer(self) -> NvmeWriter:
        return NvmeWriter(self)

    def write_master(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """Start-up in any order (sharded initialisation): the master of one whole chunk [lo, hi). Only its
        region of the record is written; the moments keep the zeros a new file reads as."""
        i = lo // self.chunk
        assert lo == i * self.chunk and hi == self._record(i)[1], "write_master takes one whole chunk"
        buf = self.buffers[0]
        self._views(buf, i, ("master",))["master"].copy_(values)
        self._wait(self._submit(True, i, buf, ("master",)))

    def close(self) -> None:
        """Stop the I/O threads and close the file: the kernel frees its space (it has no name)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.buffers = []
        self._scratch = None

    def __del__(self) -> None:  # the file has no name: closing it is all the clean-up there is
        with contextlib.suppress(OSError):
            self.close()


def _io(fd: int, write: bool, mv: memoryview, offset: int) -> None:
    """One request, retried until every byte moved (short reads/writes are legal)."""
    done = 0
    while done < len(mv):
        n = os.pwritev(fd, [mv[done:]], offset + done) if write else os.preadv(fd, [mv[done:]], offset + done)
        if n == 0:
            raise OSError(errno.EIO, "unexpected end of the state file")
        done += n
