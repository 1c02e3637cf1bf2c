"""Claim a converter's output folder, write it aside, publish it whole, and never delete what is not ours.

    with claimed_output(out, protect=[src]) as staging:   # staging: OUT's parent/.<name>.zbench-partial
        ...write every file into staging...
    # committed: staging renamed onto OUT; on any failure only what this process created is removed

The claim is an exclusive mkdir of a staging folder whose name is fixed by OUT, holding an owner
record (pid, host, process start, time), so of two converts into one OUT exactly one proceeds and the
other is told who is writing. A convert killed mid-way leaves its staging folder; the next run names
it and says whether its owner still runs. We never delete such a folder ourselves: no cleanup removes
what the same process did not create (parents included, which are only rmdir'ed, and only if ours).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import stat
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator

from .paths import NAME_MAX_BYTES
from .source import CheckpointError

OWNER_FILE = ".zbench-convert-owner.json"
_SUFFIX = ".zbench-partial"
_OWNER_MAX_BYTES = 4096
_OWNER_WAIT_S, _OWNER_POLL_S = 2.0, 0.05  # a fresh claim records its owner right after its mkdir


def staging_dir(out: str | os.PathLike) -> Path:
    """The staging folder for `out`: `.<name>.zbench-partial` beside it (a digest if the name is long)."""
    out = Path(out)
    name = f".{out.name}{_SUFFIX}"
    if len(os.fsencode(name)) > NAME_MAX_BYTES:
        name = f".{hashlib.sha256(os.fsencode(out.name)).hexdigest()[:32]}{_SUFFIX}"
    return out.parent / name


def check_output(out: str | os.PathLike, protect: Iterable[str | os.PathLike] = (), name: str = "--out") -> None:
    """Refuse, before any work, an `out` inside a `protect` folder, holding files, or being written by another
    convert. `name`: how the messages name the argument that gave `out` (the CLI flag, or an API parameter)."""
    out = Path(out)
    long = next((p for p in out.parts if len(os.fsencode(p)) > NAME_MAX_BYTES), None)
    if long is not None:
        raise CheckpointError(
            f"{name} has a folder name longer than {NAME_MAX_BYTES} bytes ({long[:40]}...); pass a shorter {name}"
        )
    if out.name in ("", ".", ".."):  # the output is published by renaming onto OUT, which these cannot take
        raise CheckpointError(f"{name} {out} names a folder by '.' or '..', which a convert cannot replace; pass a "
                              f"new folder's name, e.g. {name} converted")
    if os.path.islink(out):
        raise CheckpointError(f"{name} {out} is a symbolic link (to {os.readlink(out)}); pass the folder it points "
                              "to, or a new folder")
    target = Path(os.path.realpath(out))
    for folder in protect:
        real = Path(os.path.realpath(folder))
        if target == real:
            raise CheckpointError(
                f"{name} {out} is the checkpoint {folder} itself: it already holds files, and writing "
                f"there would change the source; pass an {name} outside it"
            )
        if real in target.parents:
            raise CheckpointError(
                f"{name} {out} is inside the checkpoint {folder}; writing there would change the "
                f"source; pass an {name} outside it"
            )
    if os.path.lexists(out) and os.path.ismount(out):  # a rename cannot land on it, and staging beside it is elsewhere
        raise CheckpointError(f"{name} {out} is a mount point: the output is written beside it and renamed onto "
                              f"it, which a mount point cannot take; pass a new folder inside it, e.g. "
                              f"{name} {out / 'out'}")
    if os.path.lexists(out) and not out.is_dir():
        raise CheckpointError(f"{name} {out} is a file, not a folder; pass a new or empty folder as {name}")
    if os.path.lexists(out) and any(out.iterdir()):
        raise CheckpointError(f"output folder {out} already holds files; pass an empty or new {name}")
    staging = staging_dir(out)
    if os.path.lexists(staging):
        problem = _taken(out, staging, name)
        if problem:
            raise CheckpointError(problem)


@contextmanager
def claimed_output(
    out: str | os.PathLike, protect: Iterable[str | os.PathLike] = (), name: str = "--out"
) -> Iterator[Path]:
    """Claim `out`, yield the staging folder to fill, then rename it onto `out`; on failure remove only ours.
    `name`: the argument that gave `out`, as the messages name it (check_output)."""
    out = Path(out)
    protect = list(protect)
    staging = staging_dir(out)
    for _ in range(3):  # a claim released between our mkdir and our look at its owner is tried again
        check_output(out, protect, name)
        made = _make_folders(staging.parent)
        try:
            os.mkdir(staging)
            break
        except FileExistsError:
            problem = _taken(out, staging, name)
            _remove_if_empty(made)
            if problem:
                raise CheckpointError(problem) from None
        except BaseException:
            _remove_if_empty(made)
            raise
    else:
        raise CheckpointError(f"{out} is being claimed and released by other converts; run again")
    try:
        _write_owner(staging)
        yield staging
        _commit(out, staging, name)
    except BaseException:
        with contextlib.suppress(OSError):  # it may have OUT's bits by now (_keep_attributes): 0o555 bars deleting
            if not os.path.islink(staging):
                os.chmod(staging, stat.S_IRWXU)
        shutil.rmtree(staging, ignore_errors=True)  # ours: made by the exclusive mkdir above
        _remove_if_empty(made)
        raise
    try:  # published: from here the staging name may be another convert's claim, never ours to remove
        _fsync(out.parent)  # the rename itself: without it a power loss may bring back the staging name
    except OSError as e:
        raise CheckpointError(f"{out} is written but the rename that published it could not be flushed to disk "
                              f"({e.strerror or e}); run `sync` before relying on it after a power loss") from None


def _commit(out: Path, staging: Path, name: str) -> None:
    os.unlink(staging / OWNER_FILE)
    _keep_attributes(out, staging)
    _sync_tree(staging)  # every file and folder on disk before the name says the output is complete
    try:
        os.rename(staging, out)  # atomic; refused by the kernel if `out` appeared and holds anything
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise CheckpointError(
                f"output folder {out} already holds files (written while this convert ran; "
                f"left as it is); pass an empty or new {name}"
            ) from None
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL or not os.path.isdir(path):
            raise  # EINVAL on a folder: a filesystem that cannot sync folders, nothing more to do there
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every regular file under `folder` (the index, copied Hugging Face files: not all writers sync), then
    each folder, innermost first. Links are not followed: nothing outside the output is touched."""
    for top, dirs, files in os.walk(folder, topdown=False):
        for f in files:
            path = Path(top, f)
            if path.is_file() and not path.is_symlink():
                _fsync(path)
        _fsync(Path(top))


def _make_folders(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; returns those this process created, outermost first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    try:
        for p in reversed(missing):
            try:
                os.mkdir(p)
                made.append(p)
            except FileExistsError:  # made by someone else meanwhile: not ours to remove
                pass
    except BaseException:
        _remove_if_empty(made)
        raise
    return made


def _remove_if_empty(made: list[Path]) -> None:
    for p in reversed(made):
        try:
            os.rmdir(p)  # only if empty: someone may have put files there meanwhile
        except OSError:
            return


def _process_start(pid: int) -> str | None:
    """Boot id and start tick of `pid` (Linux), so a reused pid is not mistaken for the owner."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            tick = f.read().rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name
    except (OSError, IndexError):
        return None
    return f"{boot}:{tick}"


def _write_owner(staging: Path) -> None:
    pid = os.getpid()
    record = {
        "pid": pid,
        "host": socket.gethostname(),
        "process": _process_start(pid),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    # written aside, then linked into place: the record is whole the moment its name exists, so a convert
    # killed at any point never leaves an owner file that names no one
    draft = staging / f"{OWNER_FILE}.{pid}.draft"
    f = open(draft, "x", encoding="utf-8")
    try:  # from here the draft is ours to remove
        with f:
            json.dump(record, f)
        try:
            os.link(draft, staging / OWNER_FILE)  # fails if the name exists, as open(..., "x") would
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links: written in place
            with open(staging / OWNER_FILE, "x", encoding="utf-8") as owner:
                json.dump(record, owner)
    finally:
        os.unlink(draft)


def _read_owner(staging: Path) -> dict | None:
    try:  # no link, no FIFO: the folder may not be ours
        fd = os.open(staging / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(_OWNER_MAX_BYTES))
    except (OSError, ValueError):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    return record if type(pid) is int and 0 < pid < 2**31 else None  # pid 0 or -1 would signal whole groups


def _runs(owner: dict) -> bool:
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    recorded = owner.get("process")
    return recorded is None or _process_start(owner["pid"]) in (None, recorded)


def _taken(out: Path, staging: Path, name: str) -> str | None:
    """Why `staging` blocks `out`, or None if it went away (its convert finished or gave up)."""
    deadline = time.monotonic() + _OWNER_WAIT_S
    owner = _read_owner(staging)
    while owner is None and os.path.lexists(staging) and time.monotonic() < deadline:
        time.sleep(_OWNER_POLL_S)
        owner = _read_owner(staging)
    if owner is None:
        if not os.path.lexists(staging):
            return None
        return (
            f"{staging} is in the way of {name} {out} and names no zbench convert that owns it; "
            "if no convert is writing there, delete it and run again"
        )
    pid, host = owner["pid"], owner.get("host")
    if host != socket.gethostname():
        return (
            f"another zbench convert (pid {pid} on {host}) is writing {out}; wait for it or pass another {name} "
            f"(if it no longer runs, delete {staging} and run again)"
        )
    if _runs(owner):
        return f"another zbench convert (pid {pid}) is writing {out}; wait for it or pass another {name}"
    return f"{staging} is left by a zbench convert that was killed (pid {pid} no longer runs); delete it and run again"


def _keep_attributes(out: Path, staging: Path) -> None:
    """An empty `out` the user made (a setgid group folder, say) is replaced by the rename: the output takes its
    permission bits, and its owner where this process may give it."""
    try:
        st = os.stat(out)
    except FileNotFoundError:
        return
    os.chmod(staging, stat.S_IMODE(st.st_mode))
    try:
        os.chown(staging, st.st_uid, st.st_gid)
    except PermissionError:
        pass  # not root: the output keeps this process's owner
