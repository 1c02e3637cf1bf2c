"""Names of a save's temporary entries beside its checkpoints, and how to tell those a dead save left.

    ROOT/.<tag>.partial-<pid>-<token>   a save's staging folder
    ROOT/.<tag>.old-<pid>-<token>       the copy a re-save moved aside (where no atomic exchange is available)
    ROOT/.<tag>.pruned-<pid>-<token>    a copy being deleted (readers and recovery never take it)
    ROOT/.latest.tmp-<pid>-<token>      `latest` being replaced

The pid tells whether the owner still runs; the random token keeps two saves of one process apart.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

LATEST = "latest"
AUX = re.compile(r"^\.(?P<tag>.+)\.(?P<kind>partial|old|pruned|tmp)-(?P<pid>\d+)-[0-9a-f]+$")
_PID_MAX = 1 << 22  # Linux's ceiling for pid_max: a larger number names no process that could exist


def new_token() -> str:
    """A suffix no other save uses: this process's pid (so a dead owner can be told) and random bits."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def staging_dir(root: Path, tag: str, token: str) -> Path:
    return root / f".{tag}.partial-{token}"


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs now; a number no process can have (0, out of range) is not alive."""
    if not 0 < pid < _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError, OSError):
        return False
    return True


def aux_kind(d: Path) -> re.Match[str] | None:
    """The name's parts when `d` is a staging or set-aside folder, or a temporary `latest` file, of a save."""
    m = AUX.match(d.name)
    if m is None or d.is_symlink():
        return None
    if m["kind"] == "tmp":
        return m if m["tag"] == LATEST and d.is_file() else None
    return m if d.is_dir() else None


def leftovers(root: Path) -> list[Path]:
    """Staging and set-aside folders, and temporary `latest` files, under `root` whose owning process no longer
    runs (saves that died)."""
    out = []
    for d in root.iterdir() if root.is_dir() else []:
        m = aux_kind(d)
        if m and not pid_alive(int(m["pid"])):
            out.append(d)
    return sorted(out)
