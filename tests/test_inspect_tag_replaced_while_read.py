"""`zbench inspect` of a tag that another process saves again while inspect reads it says so, and to run it again,
instead of calling the checkpoint damaged (the new files do not match the manifest read before the re-save)."""

from __future__ import annotations

import pytest
from ckpt_workers import _train, config
from helpers import cli, one_line_error
from parity_workers import make_model

import zero_core
from checkpoints import zbench_source


def _engine(steps: int):
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(steps))  # two runs' weights differ, and so do their files
    return engine


@pytest.mark.parametrize("json_out", [False, True])
def test_a_tag_saved_again_while_inspect_reads_it_is_named_as_such(tmp_path, monkeypatch, json_out):
    first, second = _engine(1), _engine(2)
    first.save_checkpoint(tmp_path, tag="best")
    real_verify = zbench_source.mf.verify_files

    def verify_after_a_resave(*args, **kwargs):
        second.save_checkpoint(tmp_path, tag="best")  # another process's save of the same tag, mid-inspect
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(zbench_source.mf, "verify_files", verify_after_a_resave)
    result = cli("inspect", tmp_path, "--tag", "best", *(["--json"] if json_out else []))
    monkeypatch.undo()
    assert result.exit_code == 1
    line = one_line_error(result)
    assert "was replaced or removed while it was read" in line and "run zbench inspect again" in line, line
    assert "corrupt" not in line and "checksum" not in line and "restore" not in line, line
    again = cli("inspect", tmp_path, "--tag", "best")  # the fix it names
    assert again.exit_code == 0 and "integrity" in again.output and " ok" in again.output, again.output
    for engine in (first, second):
        engine.close()


def test_a_damaged_file_that_was_not_replaced_is_still_damage(tmp_path):
    engine = _engine(1)
    engine.save_checkpoint(tmp_path, tag="best")
    rank_file = tmp_path / "best" / "rank_00000.safetensors"
    data = bytearray(rank_file.read_bytes())
    data[-1] ^= 0xFF
    rank_file.write_bytes(bytes(data))  # in place: the same folder, the same inode
    result = cli("inspect", tmp_path, "--tag", "best")
    line = one_line_error(result)
    assert result.exit_code == 1 and "corrupted" in line and "replaced" not in line, line
    engine.close()
