"""Name the cause of a failed write in words a user can act on (disk full, quota, permissions).

safetensors' writer reports OS errors as text rather than OSError, so the text is matched too.
"""

from __future__ import annotations

import errno
import os

SPACE, ACCESS, PATH = "space", "access", "path"  # what kind of fix the cause needs
_CAUSES = {errno.ENOSPC: ("no space left on the device", SPACE), errno.EDQUOT: ("disk quota exceeded", SPACE),
           errno.EFBIG: ("file too large for the file system or the process's file-size limit", SPACE),
           errno.EACCES: ("permission denied", ACCESS), errno.EPERM: ("operation not permitted", ACCESS),
           errno.EROFS: ("read-only file system", ACCESS),
           errno.EEXIST: ("the path exists and is not a folder", PATH),
           errno.ENOTDIR: ("a part of the path is a file, not a folder", PATH)}


def write_cause(e: BaseException) -> tuple[str, str | None]:
    """(what went wrong, SPACE | ACCESS | None) for an exception raised while writing."""
    code = e.errno if isinstance(e, OSError) else None
    if code not in _CAUSES:
        text = str(e)
        code = next((c for c in _CAUSES if os.strerror(c) in text), None)
    if code in _CAUSES:
        return _CAUSES[code]
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {first}", None
