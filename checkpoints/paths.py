"""One containment rule for every path derived from a file or a name.

A checkpoint, a scenario or a run folder names other files: rank files in a manifest, chunk files in
DCP's `.metadata`, a tag in `latest`, a variant's name that becomes a folder. Each such name is
untrusted: it must be a relative path that resolves inside its folder, and, unless the caller
allows it (`--follow-symlinks`), nothing on the way from the folder to the file may be a symbolic
link. The folder itself is the user's choice and may be a link.

    path = inside(folder, rel, what="rank file")     # the resolved path, or CheckpointError
    name = plain_name(text, what="tag")              # one path component, or CheckpointError
    f"tags present: {one_line(name)}"                # a name read from disk, shown on one line

Errors are one line naming the path, the folder and the fix.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from pathlib import Path

from .source import CheckpointError

NAME_MAX_BYTES = 255  # a path component on every common file system
POINTER_MAX_BYTES = 4096  # `latest` holds one tag name; anything larger is not a pointer
# Control characters (C0, DEL, C1), invisible format characters (BOM, bidi overrides, zero-width), lone
# surrogates (undecodable bytes of a folder name) and the line/paragraph separators: any of these in a name
# splits or disguises the one-line messages that print it.
_UNSAFE_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def one_line(text: str) -> str:
    """`text` (a name or path read from disk) as it may appear in a one-line message: unchanged when every
    character prints as itself, else its escaped repr (a newline shows as \\n, never as a line break)."""
    return text if text.isprintable() else repr(text)


def plain_name(name: object, what: str, fix: str = "use a plain folder name") -> str:
    """`name` as one path component: a non-empty str without separators, NUL, a leading '.' or a character that
    breaks or hides part of a one-line message (_UNSAFE_CATEGORIES), at most 255 bytes; raises CheckpointError
    naming `what` otherwise."""
    shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80] + "...")
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{what} {shown} is not a name; {fix}")
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        raise CheckpointError(f"{what} {shown} is longer than {NAME_MAX_BYTES} bytes; {fix}")
    if "/" in name or "\\" in name or "\0" in name or name.startswith(".") or name != name.strip():
        raise CheckpointError(f"{what} {shown} is not a plain name (no '/', '\\', NUL, leading '.' or "
                              f"surrounding spaces); {fix}")
    unsafe = next((c for c in name if unicodedata.category(c) in _UNSAFE_CATEGORIES), None)
    if unsafe is not None:
        raise CheckpointError(f"{what} {shown} holds the control or invisible character {unsafe!r} "
                              f"(U+{ord(unsafe):04X}); {fix}")
    return name


def _symlink_on_the_way(folder: Path, rel: Path) -> Path | None:
    """The first component of folder/rel (below folder) that is a symbolic link, if any."""
    here = folder
    for part in rel.parts:
        here = here / part
        if here.is_symlink():
            return here
    return None


def inside(folder: str | os.PathLike, rel: str | os.PathLike, *, what: str, follow_symlinks: bool = False) -> Path:
    """folder/rel, checked to stay inside `folder`; CheckpointError (one line) otherwise.

    `rel` must be relative and must not climb out of `folder` ('..'). Without `follow_symlinks` no
    component below `folder` may be a symbolic link, so the file really lies inside the folder; with it,
    links are followed wherever they point (the user vouches for them)."""
    folder = Path(folder)
    text = os.fspath(rel)
    if not text or "\0" in text:
        raise CheckpointError(f"{what} {text!r} in {folder} is not a file name; the checkpoint is damaged or crafted: "
                              "use one written by its tool")
    if os.path.isabs(text):
        raise CheckpointError(f"{what} {one_line(text)} is an absolute path, outside {folder}; files are read only "
                              "from inside their folder: the checkpoint is damaged or crafted, use one written by its "
                              "tool")
    normal = os.path.normpath(text)
    if any(len(os.fsencode(part)) > NAME_MAX_BYTES for part in Path(normal).parts):  # the OS refuses to look it up
        raise CheckpointError(f"{what} {one_line(text[:80])}... in {folder} has a name longer than {NAME_MAX_BYTES} "
                              "bytes: the checkpoint is damaged or crafted, use one written by its tool")
    if normal == os.pardir or normal.startswith(os.pardir + os.sep):
        raise CheckpointError(f"{what} {one_line(text)} points outside {folder}; files are read only from inside their "
                              "folder: the checkpoint is damaged or crafted, use one written by its tool")
    if not follow_symlinks:
        try:
            link = _symlink_on_the_way(folder, Path(normal))
        except OSError as e:  # a loop of links, a folder we may not enter, ...
            raise CheckpointError(f"cannot look up {what} {one_line(normal[:200])} in {folder}: {e.strerror}; check "
                                  "the path and its permissions") from None
        if link is not None:
            target = one_line(os.readlink(link))
            raise CheckpointError(f"{what} {one_line(str(link))} is a symbolic link (to {target}), inside {folder}; "
                                  "replace it with the file itself, or pass --follow-symlinks to read through links")
    return folder / normal


class NotRegularFile(OSError):
    """A folder, FIFO or device where a file is read: its strerror is 'a folder' or 'not a regular file'."""


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """At most limit + 1 bytes of the regular file `path` (the caller tells "larger than limit" by the length),
    never blocking: a FIFO or anything else not a regular file raises NotRegularFile, never waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        folder = stat.S_ISDIR(mode)
        raise NotRegularFile(errno.EISDIR if folder else errno.EINVAL, "a folder" if folder else "not a regular file")
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def read_pointer(root: Path, name: str, follow_symlinks: bool = False) -> str:
    """The tag a pointer file (`latest`, `latest_universal`) in `root` names: one plain name, read with a
    size bound (and never blocking: a FIFO is refused, not waited on)."""
    path = inside(root, name, what="tag pointer", follow_symlinks=follow_symlinks)
    fix = f"write the name of a tag folder of {root} into it, or pass --tag"
    try:
        raw = read_regular(path, POINTER_MAX_BYTES)
    except NotRegularFile as e:
        raise CheckpointError(f"{path} is {e.strerror}, not a tag pointer file; {fix}") from None
    if len(raw) > POINTER_MAX_BYTES:
        raise CheckpointError(f"{path} is larger than {POINTER_MAX_BYTES} bytes, not a tag pointer file; {fix}")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not UTF-8 text, not a tag pointer file; {fix}") from None
    return plain_name(text, f"tag named by {path}:", fix)
