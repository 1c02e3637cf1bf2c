"""zbench's native checkpoint on disk: tag folders, the `latest` pointer, and the atomic commit.

    ROOT/latest                               the newest complete tag (moved only after a complete save)
    ROOT/<tag>/manifest.json, manifest.sha256 what the checkpoint holds (checkpoints/manifest.py)
    ROOT/<tag>/rank_00000.safetensors         that rank's flat partitions: master, exp_avg, exp_avg_sq (fp32)
    ROOT/<tag>/frozen.safetensors             frozen parameters and buffers (replicated, written by rank 0)

A save writes into ROOT/.<tag>.partial-<pid>-<token> and renames it to ROOT/<tag> once the manifest is in,
so a crash mid-save never damages an earlier checkpoint. Re-saving an existing tag (tag="best") exchanges the
new folder with the old one in one step (dir_exchange.py: the tag never goes missing for a reader), moves
`latest`, and only then deletes the old copy. Where the system cannot exchange, the old folder is first moved
aside to ROOT/.<tag>.old-<pid>-<token> and the new one renamed in: a crash between the two renames leaves the
old copy complete, readers use it, and the next save puts it back. Nothing here deletes a folder another
process made: staging folders of saves that died are reported with the fix, not removed. Pure file handling:
converters use it without the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from . import dir_exchange
from .manifest import MANIFEST
from .paths import inside, one_line, plain_name, read_pointer
from .save_names import AUX as _AUX
from .save_names import LATEST, leftovers, new_token
from .save_names import pid_alive as _pid_alive  # noqa: F401  (callers reach these through this module)
from .save_names import staging_dir  # noqa: F401
from .source import CheckpointError
from .tag_folder import check_replaceable


def fsync_path(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recover(root: Path) -> list[str]:
    """Put back the old copy of a tag whose replacement died between its two renames; returns those tags."""
    restored = []
    for d in leftovers(root):
        m = _AUX.match(d.name)
        assert m is not None
        final = root / m["tag"]
        if m["kind"] == "old" and not os.path.lexists(final) and (d / MANIFEST).is_file():
            os.replace(d, final)
            restored.append(m["tag"])
    if restored:
        fsync_path(root)
    return restored


def folder_identity(folder: Path) -> tuple[int, int] | None:
    """Which folder `folder` names now (device, inode): a save of the same tag renames a new one into place."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _write_latest(root: Path, tag: str) -> None:
    tmp = root / f".{LATEST}.tmp-{new_token()}"
    try:
        tmp.write_text(tag, encoding="utf-8")  # no newline, as DeepSpeed writes it: scripts join it to a path
        fsync_path(tmp)
        os.replace(tmp, root / LATEST)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)  # made by this very call
        except OSError:
            pass
        raise


def commit(root: Path, tag: str, staged: Path, move_latest: bool = True) -> str | None:
    """Publish the complete folder `staged` as ROOT/<tag>, then point `latest` at it (rank 0 only). An OSError
    means nothing was published (a failed move of `latest` puts the replaced copy back and the new one back in
    `staged`); once it is, only a note (the replaced copy left on disk) can come back."""
    fsync_path(staged)
    check_replaceable(root, tag)  # again: a link may have appeared since the save began
    old = _swap_in(root, tag, staged)
    fsync_path(root)
    if move_latest:
        try:
            _write_latest(root, tag)
        except OSError as e:
            note = _roll_back(root, tag, staged, old)
            if note is None:
                raise
            return f"'{LATEST}' could not be updated ({e.strerror or e}) and {note}"
        fsync_path(root)  # `latest` is moved: a failure here is no longer undone
    if old is not None:  # the copy this save replaced, moved out of the tag's name by this very call
        return _removed(_retired(root, tag, old), "the copy it replaced")
    return None


def _swap_in(root: Path, tag: str, staged: Path) -> Path | None:
    """Rename `staged` to ROOT/<tag>; where the copy it replaced is now (None if there was none). Where the system
    can, the two folders exchange names in one step, so the tag never goes missing for a reader: the replaced copy
    is then in `staged`. Elsewhere it is first moved aside to `.<tag>.old-...`, which readers use meanwhile."""
    final = root / tag
    if final.exists():
        try:
            if dir_exchange.exchange(staged, final):
                return staged
        except FileNotFoundError:
            pass  # the tag went away meanwhile (pruned, or another save's two renames): a plain rename publishes it
    old = None
    if final.exists():
        old = root / f".{tag}.old-{new_token()}"
        os.replace(final, old)  # from here until the next rename, readers and recover() use `old`
    try:
        os.replace(staged, final)
    except OSError:
        if old is not None:  # put back, else `tag` stays missing while this process lives (readers skip a live `old`)
            with contextlib.suppress(OSError):  # left aside (reported later) if another save's folder took the name
                os.rename(old, final)
        raise
    return old


def _retired(root: Path, tag: str, old: Path) -> Path:
    """`old` renamed to a name readers and recover() never take, before it is deleted: a save killed mid-delete
    must not leave a half-deleted `.old` copy that a reader or the next save would take for the whole one."""
    doomed = root / f".{tag}.pruned-{new_token()}"
    try:
        os.rename(old, doomed)
    except OSError:
        return old
    return doomed


def _roll_back(root: Path, tag: str, staged: Path, old: Path | None) -> str | None:
    """Undo commit's renames (new copy back to `staged`, the replaced one back as `tag`); None once undone,
    else what is where now: the new copy stands as `tag` and `latest` still names what it named."""
    final = root / tag
    if old == staged:  # exchanged: exchanging again undoes it in one step
        try:
            undone = dir_exchange.exchange(final, staged)
        except OSError as e:
            undone, why = False, e.strerror or str(e)
        else:
            why = "this system cannot exchange the two folders back"
        if not undone:
            return f"could not be undone ({why}): {tag} holds this save, '{LATEST}' is unchanged; the copy it " \
                   f"replaced is in {staged}"
        fsync_path(root)
        return None
    try:
        os.replace(final, staged)
    except OSError as e:
        where = f"; the copy it replaced is in {old}" if old is not None else ""
        return f"could not be undone ({e.strerror or e}): {tag} holds this save, '{LATEST}' is unchanged{where}"
    try:
        if old is not None:
            os.replace(old, final)
        fsync_path(root)
    except OSError as e:
        return (f"could not be undone ({e.strerror or e}): this save is in {staged} and the copy it replaced in "
                f"{old}; rename that one back to {tag}")
    return None


def _removed(folder: Path, what: str) -> str | None:
    """Delete `folder` (this save's own leftover); a note instead of an error if it cannot be: the save stands."""
    try:
        shutil.rmtree(folder)
    except OSError as e:
        return f"{what} could not be deleted ({e.strerror or e}): delete {folder} once no save is running"
    return None


def complete_tags(root: Path) -> list[tuple[int, str]]:
    """(step, tag) of every complete checkpoint folder under root (one with a manifest), oldest first."""
    out = []
    for d in root.iterdir() if root.is_dir() else []:
        if d.is_dir() and not d.is_symlink() and not d.name.startswith(".") and (d / MANIFEST).is_file():
            try:
                step = json.loads((d / MANIFEST).read_text(encoding="utf-8"))["step"]
                out.append((step if isinstance(step, int) else -1, d.name))
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                out.append((-1, d.name))
    return sorted(out)


def prune(root: Path, keep_last: int, saved: list[tuple[str, tuple[int, int] | None]]) -> list[str]:
    """Delete the oldest of `saved` (this saver's own commits, oldest first: (tag, folder_identity)) until
    `keep_last` remain. A checkpoint this saver did not write is never touched: not another process's, not an
    earlier run's, not one saved again under the same tag since, and never the one `latest` names. Each goes in
    one rename first, so a reader sees it whole or not at all. Returns notes on what could not be deleted."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    notes: list[str] = []
    while len(saved) > keep_last:
        tag, identity = saved.pop(0)
        folder = root / tag
        try:
            named = read_latest(root)
        except (CheckpointError, OSError) as e:
            saved.insert(0, (tag, identity))
            notes.append(f"older checkpoints were not pruned (keep_last): {e}")
            break
        if identity is None or folder_identity(folder) != identity or named == tag:
            continue  # saved again by someone else, or what readers resume from: no longer this saver's to delete
        doomed = root / f".{tag}.pruned-{new_token()}"
        try:
            os.replace(folder, doomed)
        except OSError:
            continue  # moved or removed by another process meanwhile
        if folder_identity(doomed) != identity:  # replaced between the check and the rename: not ours, put back
            try:
                os.rename(doomed, folder)
            except OSError as e:
                notes.append(f"{doomed.name} was not ours to delete and could not be put back as {tag} "
                             f"({e.strerror}): rename it back by hand")
            continue
        note = _removed(doomed, f"the older checkpoint {tag}")
        if note:
            notes.append(note)
    return notes


def read_latest(root: Path, follow_symlinks: bool = False) -> str | None:
    """The tag `latest` names (None when there is no `latest`); one line of a plain folder name."""
    if not os.path.lexists(root / LATEST):
        return None
    try:
        return read_pointer(root, LATEST, follow_symlinks)
    except OSError as e:
        raise CheckpointError(f"cannot read {root / LATEST} ({e.strerror}); pass --tag or fix the file") from None


def set_aside_copy(root: Path, tag: str) -> Path | None:
    """The complete old copy of `tag` left by a replacement that died between its renames, if any."""
    for d in leftovers(root):
        m = _AUX.match(d.name)
        if m and m["tag"] == tag and m["kind"] == "old" and (d / MANIFEST).is_file():
            return d
    return None


def resolve(path: str | os.PathLike, tag: str | None = None, follow_symlinks: bool = False) -> Path:
    """The checkpoint folder for `path` (a root with `latest`, or a tag folder itself) and `tag`."""
    root = Path(path)
    try:
        exists = root.exists()
    except OSError as e:
        raise CheckpointError(f"checkpoint path {str(root)[:200]} cannot be used ({e.strerror})") from None
    if not exists:
        raise CheckpointError(f"checkpoint path {root} does not exist; pass the folder given to save_checkpoint")
    if tag is None and (root / MANIFEST).is_file():
        return root
    if tag is None:
        tag = read_latest(root, follow_symlinks)
        if tag is None:
            raise CheckpointError(f"{root} has no '{LATEST}' file and no {MANIFEST}; pass --tag or a checkpoint folder")
    else:
        plain_name(tag, "tag", "pass the name of a checkpoint folder, e.g. --tag global_step2")
    folder = inside(root, tag, what="checkpoint folder", follow_symlinks=follow_symlinks)
    if not (folder / MANIFEST).is_file():
        aside = set_aside_copy(root, tag)
        if aside is not None:
            return aside
        present = ", ".join(one_line(t) for _, t in complete_tags(root))
        fix = f"tags present: {present}; pick one of those" if present else "it holds none; load another folder"
        raise CheckpointError(f"no complete checkpoint '{tag}' in {root} ({fix})")
    return folder
