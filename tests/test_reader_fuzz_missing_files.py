"""A checkpoint with a file it needs gone, as a partial copy leaves it: a DeepSpeed universal checkpoint without the
model-states file ds_to_universal.py copies beside zero/ (`zbench convert` wrote its weights without the frozen
parameter, the buffer and the tie, and said nothing), and a DeepSpeed checkpoint whose `latest` is gone
(`load_checkpoint` took the folder for a first run's and loaded nothing). Each is one line naming what is missing."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_deepspeed_resume import _engine

from checkpoint_helpers import UNIVERSAL
from checkpoints.source import CheckpointError
from helpers import FIXTURES, one_line_error, read_command, zbench


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_a_universal_checkpoint_without_its_model_states_is_named(tmp_path, command):
    folder = tmp_path / "ck"
    shutil.copytree(UNIVERSAL[0], folder, ignore=shutil.ignore_patterns("expected*", "continued*"))
    for states in folder.glob("*/*model_states.pt"):
        states.unlink()
    line = one_line_error(zbench(*map(str, read_command(command, folder, tmp_path / "out"))))
    assert "has no model-states files beside zero/" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_load_checkpoint_of_a_deepspeed_folder_without_latest_names_it(tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(FIXTURES / "deepspeed" / "2_2_fp32", folder, ignore=shutil.ignore_patterns("expected*"))
    (folder / "latest").unlink()
    engine = _engine(2)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError, match="has no 'latest' file"):
        engine.load_checkpoint(folder)
    assert all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
    assert engine.load_checkpoint(folder, tag="global_step2")[0] is not None  # the tag, named, still loads
    engine.close()


def test_load_checkpoint_of_a_universal_folder_whose_tag_is_gone_names_it(tmp_path):
    """`latest_universal` names a tag that is not there: a damaged checkpoint, not a first run's empty folder."""
    folder = tmp_path / "ck"
    shutil.copytree(UNIVERSAL[0], folder, ignore=shutil.ignore_patterns("expected*", "continued*"))
    for tag in folder.glob("global_step*"):
        shutil.rmtree(tag)
    engine = _engine(2)
    with pytest.raises(CheckpointError):
        engine.load_checkpoint(folder)
    engine.close()
