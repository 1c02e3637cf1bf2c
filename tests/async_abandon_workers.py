"""Rank functions for async saves that rank 0 gives up on while rank 1 is still writing its file."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import torch.distributed as dist

from ckpt_workers import _train, config
from parity_workers import make_model

POLLS = 3000  # 60 s at most for rank 0 to give up: a bound on a hung test, not a timing under test


def _until_rank_0_gave_up(staged: Path) -> None:
    """Poll until rank 0 marked the staging folder abandoned (or deleted it)."""
    for _ in range(POLLS):
        if (staged / ".abandoned").exists() or not staged.exists():
            return
        time.sleep(0.02)


def rank_0_gives_up_while_rank_1_writes(rank: int, world: int, ckpt: str, case: str) -> dict:
    """Save, train on, then save asynchronously while rank 1 is mid-way through its file until rank 0 has given up:
    its wait ran out (`timeout`), or its own write failed (`rank 0 fails`). Then save again."""
    import zero_core
    from checkpoints.source import CheckpointError
    from zero_core import checkpoint_async, checkpointing

    engine = zero_core.initialize(make_model(), {**config(2, world), "zero_core": {"comm_timeout_s": 30}})
    _train(engine, rank, world, range(2))
    engine.save_checkpoint(ckpt)
    _train(engine, rank, world, range(2, 3))
    if case == "timeout":
        checkpoint_async.saver_of(engine).wait_s = 1.0
    real_write, seen = checkpointing._write_synced, {}

    def write(tensors, path):
        if rank == 0 and case == "rank 0 fails" and path.name == "rank_00000.safetensors":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        if rank == 1:
            with open(path, "wb") as f:  # mid-way through its file when rank 0 gives up
                f.write(b"\0" * 4096)
                f.flush()
                _until_rank_0_gave_up(path.parent)
                seen["file kept while written"] = path.is_file()
        return real_write(tensors, path)

    checkpointing._write_synced = write
    try:
        engine.save_checkpoint(ckpt, async_save=True)
        engine.wait_for_checkpoint()
        message = None
    except CheckpointError as e:
        message = str(e)
    finally:
        checkpointing._write_synced = real_write
    dist.barrier()  # every rank's background thread has ended: wait_for_checkpoint joined it
    heard = [seen if rank == 1 else None]
    dist.broadcast_object_list(heard, src=1)
    left = sorted(os.listdir(ckpt))
    staged = [p for p in left if p.startswith(".global_step3.partial-")]
    inside = sorted(os.listdir(Path(ckpt, staged[0]))) if staged else []
    dist.barrier()
    engine.save_checkpoint(ckpt, tag="next")  # removes what the abandoned save left, once nobody writes there
    after = sorted(os.listdir(ckpt))
    engine.close()
    return {"message": message, "rank 1": heard[0], "left": left, "inside": inside, "after": after}
