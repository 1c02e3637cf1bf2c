"""Whether the checkpoint folder a reader opened is still the one under its name.

A save of the same tag by another process puts a new folder under that name (and deletes the old one), and a
prune removes it. A reader that went on reading across that moment holds pieces of two checkpoints, or meets
files that vanished: what looks like damage is a replacement. `convert` and `inspect` ask here before they
publish or judge anything, and say "run it again" instead of "corrupted".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .source import CheckpointError
from .zbench_format import folder_identity

MIXED = "the output could mix two checkpoints; nothing was written: convert again"  # a convert's consequence


class FolderWatch:
    """The identity (device, inode) of the source's folder when it was opened, to compare with the folder now."""

    def __init__(self, source: Any) -> None:
        folder = getattr(source, "folder", None)
        self.folder: Path | None = Path(folder) if folder is not None else None
        opened = getattr(source, "identity", None)  # taken before the manifest was read, where the source keeps it
        self.identity = opened if opened is not None else (folder_identity(self.folder) if self.folder else None)

    def replaced(self) -> bool:
        return self.identity is not None and folder_identity(self.folder) != self.identity

    def message(self, consequence: str) -> str:
        return (f"{self.folder} was replaced or removed while it was read (another process saved that tag again or "
                f"pruned it), so {consequence}")

    def check(self, consequence: str) -> None:
        """CheckpointError (one line, ending with what to do) if the folder was replaced since it was opened."""
        if self.replaced():
            raise CheckpointError(self.message(consequence))
