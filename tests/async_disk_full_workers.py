"""Rank functions for an async save whose disk fills on one rank: the rank's marker must still reach rank 0."""

from __future__ import annotations

import errno
import os

from ckpt_workers import _train, config
from parity_workers import make_model

WAIT_S = 20.0  # rank 0's wait for the other ranks' markers; a rank whose marker never comes costs this much


def disk_full_on_rank_1_async(rank: int, world: int, ckpt: str) -> dict:
    """Save, train on, then save asynchronously while rank 1's disk is full: its part-written file holds the last
    free space, so its marker fits only once that file is gone."""
    import zero_core
    from checkpoints.source import CheckpointError
    from zero_core import checkpoint_async, checkpointing

    engine = zero_core.initialize(make_model(), {**config(2, world), "zero_core": {"comm_timeout_s": WAIT_S}})
    _train(engine, rank, world, range(2))
    engine.save_checkpoint(ckpt)
    _train(engine, rank, world, range(2, 3))
    real_write, real_marker = checkpointing._write_synced, checkpoint_async._leave_marker

    def full_disk(tensors, path):
        if rank == 1:
            with open(path, "wb") as f:
                f.write(b"\0" * 100)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(tensors, path)

    def marker_needs_space(staged, r, report):
        if rank == 1 and (staged / "rank_00001.safetensors").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(staged))
        real_marker(staged, r, report)

    checkpointing._write_synced, checkpoint_async._leave_marker = full_disk, marker_needs_space
    try:
        engine.save_checkpoint(ckpt, async_save=True)
        engine.wait_for_checkpoint()
        message = None
    except CheckpointError as e:
        message = str(e)
    finally:
        checkpointing._write_synced, checkpoint_async._leave_marker = real_write, real_marker
    listing = sorted(os.listdir(ckpt))
    engine.close()
    return {"message": message, "listing": listing}
