"""Large host buffers on 2 MiB pages, where the kernel grants them.

Linux hosts often set transparent huge pages to `madvise`: a process gets 2 MiB pages only for memory it marks
with madvise(MADV_HUGEPAGE), and torch's CPU allocator marks nothing unless THP_MEM_ALLOC_ENABLE=1 is set
before it first allocates. The offloaded optimizer then streams tens of GB per step through 4 KiB pages, one
TLB entry per 4 KiB. On one H100 machine's host (16 cores), 2 MiB pages took a 16-thread copy from 80.8 to
104.6 GB/s and the host AdamW from 4.22 to 4.66 G elements/s, and a 7 B GPT's step took 3.5 s where it had
taken 3.9-4.3 s on 4 KiB pages on another machine of that kind
(docs/benchmarks/2026-11-26_h100_gpt7b_huge_pages.md). Marking a buffer before its first touch is enough: the
pages are taken at first touch. Where the kernel refuses (THP off, another OS), the buffer is an ordinary one.

`ZERO_CORE_HUGE_PAGES=0` (or off/false/no) leaves every buffer on the kernel's default pages: for an A/B, or a
host where compacting memory into 2 MiB pages at first touch stalls.
"""

from __future__ import annotations

import ctypes
import sys

import torch

from .env_switch import env_switch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # <linux/mman.h>
MADV_DONTNEED = 4
PAGE = 4096
ADVISE_MIN_BYTES = 64 << 20  # smaller buffers gain little and would waste up to a page each on alignment
ENV = "ZERO_CORE_HUGE_PAGES"


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_madvise = _libc_madvise()


def advise_huge_pages(addr: int, nbytes: int) -> bool:
    """Ask for 2 MiB pages over [addr, addr + nbytes) (addr 2 MiB-aligned); whether the kernel accepted."""
    assert addr % HUGE_PAGE == 0
    return _madvise is not None and _madvise(addr, nbytes, MADV_HUGEPAGE) == 0


def empty_host(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D CPU tensor; from ADVISE_MIN_BYTES on, 2 MiB-aligned and marked for 2 MiB pages
    before anything touches it."""
    nbytes = numel * dtype.itemsize
    if nbytes < ADVISE_MIN_BYTES or env_switch(ENV) is False:
        return torch.empty(numel, dtype=dtype)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # untouched: the allocator maps it lazily
    start = -raw.data_ptr() % HUGE_PAGE
    region = raw[start : start + nbytes]
    advise_huge_pages(region.data_ptr(), nbytes // HUGE_PAGE * HUGE_PAGE)  # whole pages; the tail stays small
    return region.view(dtype)


def release_pages(t: torch.Tensor) -> int:
    """Give the host pages wholly inside CPU tensor `t` back to the kernel (madvise(MADV_DONTNEED)); the bytes
    released. For memory that will not be read again while its allocation lives on, such as the front of a
    buffer whose tail is still in use: released pages read as zeros if touched. 0 where the kernel has no such
    call, or refuses (page-locked memory)."""
    assert t.device.type == "cpu" and t.is_contiguous()
    start = -(-t.data_ptr() // PAGE) * PAGE
    end = (t.data_ptr() + t.numel() * t.element_size()) // PAGE * PAGE
    if _madvise is None or end <= start or _madvise(start, end - start, MADV_DONTNEED) != 0:
        return 0
    return end - start
