"""A save over an existing tag whose rename into place fails puts the copy it moved aside back under the tag's name:
`latest` keeps naming a complete checkpoint while the process lives on (readers use a set-aside copy only once
its process is gone)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest
import torch
from ckpt_workers import _train, config
from parity_workers import make_model

import zero_core
from checkpoints import dir_exchange
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource


def test_a_failed_rename_into_place_puts_the_replaced_copy_back(tmp_path, monkeypatch):
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path, tag="best")
    saved = engine.full_state_dict()
    _train(engine, 0, 1, range(1, 2))
    real_replace = os.replace

    def staged_rename_fails(src, dst):
        if os.path.basename(src).startswith(".best.partial-"):  # the staged folder itself, not a file in it
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(src))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", staged_rename_fails)
    monkeypatch.setattr(dir_exchange, "renameat2_exchange", None)  # the two-rename path, where no exchange exists
    with pytest.raises(CheckpointError, match="checkpoint best was not saved"):
        engine.save_checkpoint(tmp_path, tag="best")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["best", "latest"]  # nothing left aside, nothing staged
    assert fmt.read_latest(tmp_path) == "best"
    assert ZbenchSource(tmp_path / "best").verify() == []
    fresh = zero_core.initialize(make_model(), config(2, 1))
    fresh.load_checkpoint(tmp_path)
    after = fresh.full_state_dict()
    assert all(torch.equal(after[k], saved[k]) for k in saved)
    for e in (engine, fresh):
        e.close()


# saves "best" twice, killed (no clean-up runs) after deleting one file of the copy the second save replaced
_KILLED_MID_DELETE = """
import os, shutil, sys
from ckpt_workers import _train, config
from parity_workers import make_model
import zero_core
engine = zero_core.initialize(make_model(), config(2, 1))
_train(engine, 0, 1, range(1))
engine.save_checkpoint(sys.argv[1], tag="best")
_train(engine, 0, 1, range(1, 2))
def killed_mid_delete(path, *args, **kwargs):
    os.unlink(os.path.join(path, "rank_00000.safetensors"))
    os._exit(9)
shutil.rmtree = killed_mid_delete
engine.save_checkpoint(sys.argv[1], tag="best")
"""


@pytest.mark.slow  # a killed subprocess (2.5 s on 2 cores)
def test_a_save_killed_while_deleting_the_replaced_copy_leaves_nothing_to_take_for_it(tmp_path):
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_DELETE, str(tmp_path)], cwd=tests,
                          env={**os.environ, "PYTHONPATH": tests}, capture_output=True, text=True)
    assert done.returncode == 9, done.stderr[-2000:]
    assert ZbenchSource(tmp_path / "best").verify() == []  # the new copy is committed and whole
    shutil.rmtree(tmp_path / "best")  # gone (deleted by hand, or mid-replacement by another save)
    assert fmt.recover(tmp_path) == []  # the half-deleted copy is not put back as "best"
    with pytest.raises(CheckpointError, match="no complete checkpoint 'best'"):
        fmt.resolve(tmp_path)  # nor read in its place
