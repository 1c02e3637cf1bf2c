"""Give back the pages of a memory-mapped checkpoint range once it has been copied out.

Pages read through a file mapping count in the process's resident set until the mapping goes, and
torch keeps a loaded file's mapping for as long as anything references its storages. For clean pages
of a private file mapping, madvise(MADV_DONTNEED) drops them at once; touching them again re-reads
the file, so this is safe for read-only use. Never call it on anonymous memory: there it zeroes data.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import torch

_MADV_DONTNEED = 4
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None


def drop_file_pages(t: torch.Tensor) -> None:
    """Release the whole pages under `t`, which must view a private read-only-used file mapping."""
    if _libc is None or t.numel() == 0:
        return
    page = mmap.PAGESIZE
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    lo, hi = start // page * page, -(-end // page) * page  # edge pages too: clean file pages re-read on touch
    _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)
