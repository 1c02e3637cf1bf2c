"""Swap two directory entries in one step: Linux's renameat2(RENAME_EXCHANGE), called through ctypes.

A save that replaces a tag folder with two renames (old copy aside, new copy in) leaves a moment when the tag's
name points nowhere, and a reader in that moment is told the checkpoint does not exist. Exchanging the staged
folder with the published one leaves no such moment: a reader sees the old copy or the new one.

Where the system cannot exchange (another OS, a C library without renameat2 on an unknown architecture, a kernel
or filesystem that answers EINVAL, ENOSYS or EOPNOTSUPP: older kernels, some NFS, FUSE or overlay setups),
`exchange` says so without moving anything and the caller renames twice, as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from typing import Callable

RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100  # paths taken relative to the working directory, as rename() takes them
_SYSCALL_NUMBER = {"x86_64": 316, "aarch64": 276}  # a C library older than glibc 2.28 has no wrapper
UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


def _load() -> Callable[[bytes, bytes], int] | None:
    """A call renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) returning 0 or -1 (errno in ctypes'), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "renameat2", None)  # glibc 2.28 and later
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return lambda a, b: fn(_AT_FDCWD, a, _AT_FDCWD, b, RENAME_EXCHANGE)
    number = _SYSCALL_NUMBER.get(platform.machine())
    if number is None:
        return None
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    return lambda a, b: syscall(ctypes.c_long(number), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(a),
                                ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(b), ctypes.c_uint(RENAME_EXCHANGE))


renameat2_exchange = _load()


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the entries `a` and `b` (both must exist) in one step. True once swapped; False where this system
    cannot exchange (nothing moved: rename instead); an OSError for any other refusal (nothing moved either)."""
    call = renameat2_exchange
    if call is None:
        return False
    if call(os.fsencode(a), os.fsencode(b)) == 0:
        return True
    err = ctypes.get_errno()
    if err in UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))
