"""A manifest that gives one key twice in an object (with its checksum file rewritten to match) is refused in one
line: Python's json keeps the last value and other readers the first, so two tools could read two different
checkpoints out of one file. A manifest as zero_core writes it, client_state keys of every kind included, loads."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from fault_workers import tiny_checkpoint
from helpers import cli, one_line_error, read_command, snapshot

from checkpoints import manifest as mf
from checkpoints.source import CheckpointError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")


def _with_a_second_step(ckpt, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    tag = next(p for p in copy.iterdir() if p.is_dir())
    raw = (tag / mf.MANIFEST).read_bytes()
    assert raw.startswith(b"{")
    raw = b'{"step": 999999, ' + raw[1:]  # the last "step" is the true one; a first-wins reader sees 999999
    (tag / mf.MANIFEST).write_bytes(raw)
    (tag / mf.CHECKSUM).write_text(f"{hashlib.sha256(raw).hexdigest()}  {mf.MANIFEST}\n")
    return copy, tag


def test_the_reader_refuses_a_key_given_twice(ckpt, tmp_path):
    assert mf.read(next(p for p in ckpt.iterdir() if p.is_dir()))["format"] == mf.FORMAT  # as written: it reads
    _, tag = _with_a_second_step(ckpt, tmp_path)
    with pytest.raises(CheckpointError, match="gives the key 'step' twice in one object") as e:
        mf.read(tag)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_inspect_and_convert_refuse_it_in_one_line(ckpt, tmp_path, command):
    copy, _ = _with_a_second_step(ckpt, tmp_path)
    before = snapshot(tmp_path)
    line = one_line_error(cli(*read_command(command, copy, tmp_path / "out")))
    assert "gives the key 'step' twice" in line
    assert snapshot(tmp_path) == before
