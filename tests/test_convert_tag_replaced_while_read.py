"""A convert whose tag folder is saved again by another process while it reads refuses to publish an output that
would mix the two checkpoints (the rank file it had open from one, the frozen tensors from the other), and says
so instead of calling the checkpoint corrupted."""

from __future__ import annotations

import os

import pytest
import torch
from ckpt_workers import _train, config
from parity_workers import make_model

import zero_core
from checkpoints.consolidate import write_consolidated
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource


def _engine(frozen_value: float):
    model = make_model()
    with torch.no_grad():
        model.blocks[0].ln1.bias.fill_(frozen_value)  # the frozen tensor tells the two savers' files apart
    engine = zero_core.initialize(model, config(2, 1))
    _train(engine, 0, 1, range(1))
    return engine


@pytest.mark.parametrize("verify", [False, True])
def test_a_tag_saved_again_mid_convert_publishes_nothing(tmp_path, verify):
    first, second = _engine(0.25), _engine(0.75)
    first.save_checkpoint(tmp_path / "ckpt", tag="best")
    source = ZbenchSource(tmp_path / "ckpt")
    real_load, loads = source.load, []

    def load_then_resave(name):
        loads.append(name)
        t = real_load(name)
        if len(loads) == 1:  # another process saves the same tag after the first tensor is read
            second.save_checkpoint(tmp_path / "ckpt", tag="best")
        return t

    source.load = load_then_resave
    out = tmp_path / "out"
    replaced = "was replaced or removed while it was read .* nothing was written: convert again"
    with pytest.raises(CheckpointError, match=replaced):
        write_consolidated(source, out, torch.float32, 10**9, progress=False, verify=verify)
    assert not os.path.lexists(out)
    assert len(loads) > 1 and "blocks.0.ln1.bias" in loads  # the frozen tensor was read after the save
    for engine in (first, second):
        engine.close()


def test_a_tag_saved_again_mid_reshard_publishes_nothing(tmp_path, monkeypatch):
    """`--to zbench`: the manifest read from the first save, the rank files from the second, would publish a
    checkpoint whose step and tensors disagree."""
    import checkpoints.reshard as reshard

    first, second = _engine(0.25), _engine(0.75)
    first.save_checkpoint(tmp_path / "ckpt", tag="best")
    source = ZbenchSource(tmp_path / "ckpt")  # its manifest is read here
    real_write = reshard._write

    def resave_then_write(*args):
        second.save_checkpoint(tmp_path / "ckpt", tag="best")  # another process saves the tag once it is open
        return real_write(*args)

    monkeypatch.setattr(reshard, "_write", resave_then_write)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match="was replaced or removed while it was read .* convert again"):
        reshard.reshard_to_zbench(source, out, 2)
    assert not os.path.lexists(out)
    for engine in (first, second):
        engine.close()
