"""Rank functions and helpers for the fault tests: a hung peer, a full disk, an unwritable folder."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ckpt_workers import _train, config
from parity_workers import make_model

HANG_TIMEOUT_S = 2.0


def hang_in_stage3_gather(rank: int, world: int, flag: str) -> dict | None:
    """Step 1 together; then rank 1 stops answering and rank 0's next stage-3 all-gather must time out."""
    import zero_core

    engine = zero_core.initialize(make_model(), {**config(3, world), "zero_core": {"comm_timeout_s": HANG_TIMEOUT_S}})
    _train(engine, rank, world, range(1))
    if rank == 1:  # hung: never joins the next collective (waits for rank 0's verdict, at most a minute)
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    try:
        _train(engine, rank, world, range(1, 2))
        return {"message": None}
    except zero_core.CollectiveTimeout as e:
        return {"message": str(e)}
    finally:
        Path(flag).touch()


def disk_full_on_rank_1(rank: int, world: int, ckpt: str) -> dict:
    """Save, train on, then save again while rank 1's disk is full mid-file; then save once more with space."""
    import zero_core
    from checkpoints.source import CheckpointError
    from zero_core import checkpointing

    engine = zero_core.initialize(make_model(), config(2, world))
    _train(engine, rank, world, range(2))
    engine.save_checkpoint(ckpt, client_state={"next_batch": 2})
    expected = engine.full_state_dict()
    _train(engine, rank, world, range(2, 3))
    real_write = checkpointing._write_synced

    def full_disk(tensors, path):
        if rank == 1:
            with open(path, "wb") as f:  # part of the file made it, then the device is full
                f.write(b"\0" * 100)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(tensors, path)

    checkpointing._write_synced = full_disk
    try:
        engine.save_checkpoint(ckpt, client_state={"next_batch": 3})
        message = None
    except CheckpointError as e:
        message = str(e)
    finally:
        checkpointing._write_synced = real_write
    listing = sorted(os.listdir(ckpt))
    engine.save_checkpoint(ckpt, client_state={"next_batch": 3})  # space again: saving works as before
    return {"message": message, "listing": listing, "expected": expected, "after": engine.full_state_dict()}


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """The OS refuses to grow any file of this process past `nbytes` (EFBIG), as a full disk refuses writes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """`folder` refuses new entries: mode 555, or for root (which ignores modes) the immutable attribute."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = lambda: folder.chmod(0o755)  # noqa: E731
    else:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            import pytest

            pytest.skip("running as root where chattr +i is unavailable: no way to make a folder unwritable")
        undo = lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)  # noqa: E731
    try:
        yield
    finally:
        undo()


def tiny_checkpoint(root: Path) -> Path:
    """A 1-rank zbench checkpoint of the parity model after one step (for convert/inspect cases)."""
    import zero_core

    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(root)
    return root
