"""Ctrl-C on two ranks while they write a synchronous save: neither waits for the other (no collective on the way
out), each deletes the file it wrote, rank 0 removes the staging folder once rank 1 has said it is done (or marks it
abandoned until then, and the next save removes it), and the previous checkpoint and `latest` are untouched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed as dist
from ckpt_workers import _train, config
from dist_harness import run_ranks
from helpers import snapshot
from parity_workers import make_model

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')


def both_ranks_interrupted_mid_write(rank: int, world: int, ckpt: str) -> dict:
    """Save, train on, save again with each rank's writer interrupted once its file is on disk; then save again."""
    import zero_core
    from zero_core import checkpointing

    engine = zero_core.initialize(make_model(), config(2, world))
    _train(engine, rank, world, range(2))
    engine.save_checkpoint(ckpt)
    before = snapshot(Path(ckpt))
    _train(engine, rank, world, range(2, 3))
    real = checkpointing._write_file

    def interrupted(content, path):
        real(content, path)
        raise KeyboardInterrupt  # the key pressed while this rank's writers run

    checkpointing._write_file = interrupted
    try:
        engine.save_checkpoint(ckpt)
        raised = None
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    finally:
        checkpointing._write_file = real
    dist.barrier()  # both ranks are out of the save
    heard = [raised]
    dist.broadcast_object_list(heard, src=1)
    left = {name: kind for name, kind in snapshot(Path(ckpt)).items() if ".partial-" not in name}
    staged = [p for p in os.listdir(ckpt) if ".partial-" in p]
    inside = sorted(os.listdir(Path(ckpt, staged[0]))) if staged else []
    dist.barrier()
    engine.save_checkpoint(ckpt)  # removes what the interrupted save left, now that every rank is done there
    after = sorted(os.listdir(ckpt))
    engine.close()
    return {"raised": [raised, heard[0]], "unchanged": left == before, "inside": inside, "after": after}


def test_ctrl_c_on_both_ranks_mid_write_leaves_no_rank_file_and_the_next_save_no_folder(tmp_path):
    got = run_ranks(both_ranks_interrupted_mid_write, 2, str(tmp_path / "ckpt"))
    assert got["raised"] == ["KeyboardInterrupt", "KeyboardInterrupt"]
    assert got["unchanged"]  # the previous checkpoint and `latest`, byte for byte
    assert set(got["inside"]) <= {".abandoned", ".rank_00001.done"}, got["inside"]  # no file of either rank
    assert got["after"] == ["global_step2", "global_step3", "latest"]
