"""Numeric fields of a manifest are checked when it is read: a checksum-consistent manifest with an update
count no counter holds, or lrs that are not numbers, is refused before the engine changes."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import zero_core
from checkpoints import manifest as mf
from checkpoints.source import CheckpointError
from ckpt_workers import _train, config
from parity_workers import make_model


def _craft(folder, change) -> None:
    m = json.loads((folder / mf.MANIFEST).read_text())
    change(m)
    data = json.dumps(m, indent=1).encode()
    (folder / mf.MANIFEST).write_bytes(data)
    (folder / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")


@pytest.mark.parametrize("change,words", [
    (lambda m: m["optimizer"].update(applied=1e300), "optimizer.applied"),
    (lambda m: m["optimizer"].update(skipped=1.5), "optimizer.skipped"),
    (lambda m: m["optimizer"].update(group_lrs="abc"), "optimizer.group_lrs"),
    (lambda m: m["optimizer"].update(group_lrs=[float("nan")]), "optimizer.group_lrs"),
    (lambda m: m["optimizer"].update(betas=["a", 0.9]), "optimizer.betas"),
    (lambda m: m["optimizer"].update(lr="fast"), "optimizer.lr"),
])
def test_crafted_numbers_are_refused_before_anything_changes(tmp_path, change, words):
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    folder = engine.save_checkpoint(tmp_path)
    mf.read(folder)  # sound as saved
    _craft(folder, change)
    with pytest.raises(CheckpointError, match=words):
        mf.read(folder)
    _train(engine, 0, 1, range(1, 2))
    before = [t.clone() for t in engine.module.state_dict().values()]
    with pytest.raises(CheckpointError, match=words) as e:
        engine.load_checkpoint(tmp_path)
    assert "\n" not in str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(before, engine.module.state_dict().values()))
