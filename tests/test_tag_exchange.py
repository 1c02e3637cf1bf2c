"""A save over an existing tag exchanges the new folder with the published one in one step (renameat2), so a reader
never finds the tag missing; where the system cannot exchange, the save falls back to two renames, as before."""

from __future__ import annotations

import ctypes
import errno
import json
import os
from pathlib import Path

import pytest
from ckpt_workers import _train, config
from parity_workers import make_model

import zero_core
from checkpoints import dir_exchange
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError

needs_exchange = pytest.mark.skipif(dir_exchange.renameat2_exchange is None, reason="no renameat2 on this system")


def _tag(root: Path, name: str, payload: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"step": 1, "payload": payload}))
    return folder


def _payload(folder: Path) -> str:
    return json.loads((folder / "manifest.json").read_text())["payload"]


def _watch_renames(monkeypatch, look):
    """Call `look()` after every rename or exchange of a folder (the moments between a commit's steps)."""
    real_replace, real_rename, real_exchange = os.replace, os.rename, dir_exchange.renameat2_exchange

    def after(fn):
        def step(*args):
            out = fn(*args)
            look()
            return out
        return step

    monkeypatch.setattr(os, "replace", after(real_replace))
    monkeypatch.setattr(os, "rename", after(real_rename))
    if real_exchange is not None:
        monkeypatch.setattr(dir_exchange, "renameat2_exchange", after(real_exchange))


def _no_exchange(monkeypatch, how: str) -> None:
    if how == "no renameat2":  # another OS, or a C library without it
        monkeypatch.setattr(dir_exchange, "renameat2_exchange", None)
    else:  # the filesystem refuses RENAME_EXCHANGE (some NFS, FUSE or overlay setups)
        def refused(a, b):
            ctypes.set_errno(errno.EINVAL)
            return -1
        monkeypatch.setattr(dir_exchange, "renameat2_exchange", refused)


@needs_exchange
def test_exchange_swaps_two_folders(tmp_path):
    _tag(tmp_path, "a", "first")
    _tag(tmp_path, "b", "second")
    assert dir_exchange.exchange(tmp_path / "a", tmp_path / "b")
    assert _payload(tmp_path / "a") == "second" and _payload(tmp_path / "b") == "first"
    with pytest.raises(FileNotFoundError):
        dir_exchange.exchange(tmp_path / "a", tmp_path / "missing")


@needs_exchange
def test_a_resave_of_a_tag_never_leaves_it_missing_for_a_reader(tmp_path, monkeypatch):
    first, second = zero_core.initialize(make_model(), config(2, 1)), zero_core.initialize(make_model(), config(2, 1))
    _train(second, 0, 1, range(1))
    first.save_checkpoint(tmp_path, tag="best")
    seen: list[str] = []

    def reader():  # what load_checkpoint, inspect and convert resolve first
        try:
            seen.append(_payload_step(fmt.resolve(tmp_path, "best")))
        except CheckpointError as e:
            seen.append(f"missing: {e}")

    _watch_renames(monkeypatch, reader)
    for engine in (second, first, second):  # two savers of one tag, as two processes would
        engine.save_checkpoint(tmp_path, tag="best")
    monkeypatch.undo()
    assert seen and not [s for s in seen if s.startswith("missing")], seen
    assert fmt.read_latest(tmp_path) == "best" and sorted(os.listdir(tmp_path)) == ["best", "latest"]
    for engine in (first, second):
        engine.close()


def _payload_step(folder: Path) -> str:
    return str(json.loads((folder / "manifest.json").read_text())["step"])


@pytest.mark.parametrize("how", ["no renameat2", "EINVAL"])
def test_where_the_system_cannot_exchange_a_resave_renames_twice(tmp_path, monkeypatch, how):
    _tag(tmp_path, "best", "old")
    staged = _tag(tmp_path, f".best.partial-{fmt.new_token()}", "new")
    _no_exchange(monkeypatch, how)
    missing: list[bool] = []
    _watch_renames(monkeypatch, lambda: missing.append(not (tmp_path / "best").exists()))
    assert fmt.commit(tmp_path, "best", staged) is None
    monkeypatch.undo()
    assert _payload(tmp_path / "best") == "new" and fmt.read_latest(tmp_path) == "best"
    assert sorted(os.listdir(tmp_path)) == ["best", "latest"]  # the replaced copy deleted, nothing staged
    assert True in missing  # the two-rename path's moment without the tag, which the exchange closes


@needs_exchange
def test_a_failed_exchange_publishes_nothing(tmp_path, monkeypatch):
    _tag(tmp_path, "best", "old")
    (tmp_path / "latest").write_text("best")
    staged = _tag(tmp_path, f".best.partial-{fmt.new_token()}", "new")

    def io_error(a, b):
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(dir_exchange, "renameat2_exchange", io_error)
    with pytest.raises(OSError, match="Input/output error"):
        fmt.commit(tmp_path, "best", staged)
    assert _payload(tmp_path / "best") == "old" and _payload(staged) == "new"


@pytest.mark.parametrize("how", ["exchange", "no renameat2"])
def test_a_failed_move_of_latest_puts_the_replaced_copy_back(tmp_path, monkeypatch, how):
    _tag(tmp_path, "best", "old")
    (tmp_path / "latest").write_text("best")
    staged = _tag(tmp_path, ".best.partial-1-ab", "new")
    if how != "exchange":
        _no_exchange(monkeypatch, how)

    def no_inode(root, tag):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fmt, "_write_latest", no_inode)
    with pytest.raises(OSError):
        fmt.commit(tmp_path, "best", staged)
    assert _payload(tmp_path / "best") == "old" and _payload(staged) == "new"
    assert sorted(os.listdir(tmp_path)) == [".best.partial-1-ab", "best", "latest"]
