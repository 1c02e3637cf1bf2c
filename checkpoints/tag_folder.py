"""What a save may replace under its tag: nothing, an empty folder, or a zbench checkpoint (a save of the same tag
replaces it, as DeepSpeed's does). A link, a file, or a folder of other files under that name is refused before
anything moves: the commit would move it aside and then delete it as the replaced copy (zbench_format.py). So is a
folder named `latest`, which the commit would fail to replace after the tag is in place."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .manifest import MANIFEST
from .paths import one_line
from .save_names import LATEST


class TagNotReplaceable(OSError):
    """ROOT/<tag> is a symbolic link, a file, or a folder holding something other than a zbench checkpoint: a save
    would move it aside and then delete it as the replaced copy."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(errno.EEXIST, what)
        self.fix = fix


def check_replaceable(root: Path, tag: str) -> None:
    """TagNotReplaceable unless ROOT/<tag> is absent, an empty folder, or a zbench checkpoint (which a save of the
    same tag replaces, as DeepSpeed's does)."""
    final = root / tag
    if final.is_symlink():
        raise TagNotReplaceable(f"{one_line(str(final))} is a symbolic link (to {one_line(os.readlink(final))}), not a "
                                "checkpoint folder", "a save never replaces a link nor writes through it: delete the "
                                "link (what it points to is kept) or pass another tag")
    if os.path.lexists(final) and not final.is_dir():
        raise TagNotReplaceable(f"{one_line(str(final))} is a file, not a checkpoint folder",
                                "move that file away or pass another tag")
    if final.is_dir() and not (final / MANIFEST).is_file() and any(final.iterdir()):
        raise TagNotReplaceable(f"{one_line(str(final))} holds files but no zbench checkpoint (no {MANIFEST})",
                                "a save replaces only a checkpoint of its own format: move that folder away or "
                                "pass another tag")
    latest = root / LATEST  # the file a save rewrites last: as a folder the commit would fail past the point of return
    if latest.is_dir() and not latest.is_symlink():
        raise TagNotReplaceable(f"{one_line(str(latest))} is a folder, where a save writes the name of the newest tag",
                                "move that folder away")
