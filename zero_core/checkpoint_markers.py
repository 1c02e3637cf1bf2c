"""The files by which an async save's ranks tell each other where they are, in the save's staging folder.

    .rank_<r>.done   rank r has finished with this folder: its files are closed (or deleted) and it writes no more
    .abandoned       rank 0 gave up on this save (a rank's failure, or the wait for a rank ran out)

Rank 0 made the staging folder, and removes it with what the ranks wrote for the save (as a failed synchronous
save does), but only once every other rank's `.done` proves that nobody still writes there: deleting a file a
slower rank is writing would leave that rank writing into nothing, and a file created after the deletion would
leave a half-removed folder. Until then the folder stays, marked abandoned: each rank that finishes deletes its own
files and leaves its `.done`, and the next save of the same process removes the folder once every `.done` is in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from checkpoints.paths import one_line
from checkpoints.save_names import AUX

ABANDONED = ".abandoned"
_MAX_WORLD = 1 << 20  # a world size read back from an abandoned folder: plain data, checked before use


def done(staged: Path, rank: int) -> Path:
    return staged / f".rank_{rank:05d}.done"


def abandon(staged: Path, world: int) -> None:
    """Mark the folder abandoned, naming how many ranks write there (whole or not at all: written aside first). A
    mark that cannot be written (a full disk) leaves the folder for a person to remove: it is never deleted
    unproven."""
    tmp = staged / f"{ABANDONED}.tmp"
    try:
        tmp.write_text(json.dumps({"world": world}), encoding="utf-8")
        os.replace(tmp, staged / ABANDONED)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # made by this very call


def abandoned(staged: Path) -> bool:
    return (staged / ABANDONED).is_file()


def others_done(staged: Path, world: int) -> bool:
    """Whether every rank but 0 (the caller, whose own thread is here) has left its `.done` in `staged`."""
    return all(done(staged, rank).is_file() for rank in range(1, world))


def give_up(staged: Path, world: int, own_files: list[str]) -> bool:
    """Rank 0, after a failed save: remove the staging folder if no rank still writes there (True), else delete
    only rank 0's own files and leave the folder marked abandoned (False)."""
    abandon(staged, world)
    if others_done(staged, world):
        shutil.rmtree(staged, ignore_errors=True)  # made by rank 0; every rank is done with it
        return True
    for name in own_files:
        (staged / name).unlink(missing_ok=True)
    return False


def _world(staged: Path) -> int | None:
    try:
        world = json.loads((staged / ABANDONED).read_text(encoding="utf-8"))["world"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return world if type(world) is int and 0 < world <= _MAX_WORLD else None


def sweep(root: Path) -> None:
    """Rank 0, before a save: remove the staging folders this process's earlier saves abandoned whose every rank has
    finished since; print one line about those a rank still has not."""
    held = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        m = AUX.match(d.name)
        if m is None or m["kind"] != "partial" or int(m["pid"]) != os.getpid() or d.is_symlink() or not abandoned(d):
            continue  # only this process's own staging folders (rank 0 made them), and only abandoned ones
        world = _world(d)
        if world is not None and others_done(d, world):
            shutil.rmtree(d, ignore_errors=True)
        else:
            held.append(one_line(d.name))
    if held:
        print(f"zero_core: {len(held)} staging folder(s) of abandoned saves in {root} ({', '.join(held[:3])}) wait "
              "for a rank that has not finished writing there; a later save removes them once it has, or delete "
              "them once no save is running", flush=True)
