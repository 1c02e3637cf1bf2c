"""A convert whose publishing rename fails (its empty --out was filled meanwhile) removes its staging folder even
where that folder had already taken --out's permission bits (a read-only 0o555 folder): a user's rmtree cannot
delete inside a folder it may not write, so the folder is made writable again first."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch

from checkpoints import output_claim
from checkpoints.consolidate import write_consolidated
from checkpoints.source import CheckpointError
from test_consolidate import DictSource


def _as_a_user(real):
    """shutil.rmtree as a process without root's override of permission bits sees it (these tests may run as root):
    nothing inside a folder without the owner's write bit can be deleted, and ignore_errors leaves it."""

    def rmtree(path, ignore_errors=False):
        if not os.path.islink(path) and not os.stat(path).st_mode & stat.S_IWUSR:
            if ignore_errors:
                return
            raise PermissionError(13, "Permission denied", str(path))
        real(path, ignore_errors=ignore_errors)

    return rmtree


def test_a_failed_publish_into_a_read_only_empty_out_leaves_no_staging_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)  # the user's empty output folder; the output takes its bits
    real_sync = output_claim._sync_tree

    def someone_writes_out_meanwhile(folder):
        (out / "theirs.txt").write_text("theirs")  # root ignores the 0o555; a user's own folder would let them
        real_sync(folder)

    monkeypatch.setattr(output_claim, "_sync_tree", someone_writes_out_meanwhile)
    monkeypatch.setattr(output_claim.shutil, "rmtree", _as_a_user(shutil.rmtree))
    source = DictSource({"w": torch.ones(3)})
    with pytest.raises(CheckpointError, match="already holds files"):
        write_consolidated(source, out, torch.float32, 1 << 30, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .out.zbench-partial left
    assert (out / "theirs.txt").read_text() == "theirs"
