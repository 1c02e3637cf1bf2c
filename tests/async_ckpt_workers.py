"""Rank functions for the async-save tests: saves killed at each phase of their background write."""

from __future__ import annotations

import os

import torch

from ckpt_workers import _train, config
from parity_workers import make_model

PHASES = ("copy", "rank_file", "marker", "manifest", "rename", "latest")


def _die_at(phase: int | str, rank: int) -> None:
    """Make this process exit abruptly at `phase` of the next save (only rank 1 for its own files)."""
    from checkpoints import manifest as mf
    from checkpoints import zbench_format as fmt
    from zero_core import checkpoint_async, checkpoint_snapshot, checkpointing

    def die(*args, **kwargs):
        os._exit(17)

    if phase == "copy":
        checkpoint_snapshot.HostBuffers.copy = die
    elif phase == "rank_file" and rank == 1:
        def half_written(tensors, path):
            with open(path, "wb") as f:
                f.write(b"\0" * 100)
            os._exit(17)
        checkpointing._write_synced = half_written
    elif phase == "marker" and rank == 1:
        checkpoint_async._leave_marker = die
    elif phase == "manifest" and rank == 0:
        mf.write = die
    elif phase == "rename" and rank == 0:
        fmt.commit = die
    elif phase == "latest" and rank == 0:
        fmt._write_latest = die


def killed_during_async_save(rank: int, world: int, ckpt: str, phase: str) -> None:
    """Save synchronously, train on, then die at `phase` of an async save."""
    import zero_core

    engine = zero_core.initialize(make_model(), config(2, world))
    _train(engine, rank, world, range(2))
    engine.save_checkpoint(ckpt, client_state={"next_batch": 2})
    torch.save(engine.full_state_dict(), os.path.join(ckpt, f"expected_rank{rank}.pt"))
    _train(engine, rank, world, range(2, 3))
    _die_at(phase, rank)
    engine.save_checkpoint(ckpt, client_state={"next_batch": 3}, async_save=True)
    engine.wait_for_checkpoint()
    os._exit(17)  # a phase that did not fire would otherwise pass silently


def async_then_train(rank: int, world: int, ckpt: str) -> dict:
    """An async save followed at once by more training: the checkpoint holds the state at the save."""
    import zero_core

    engine = zero_core.initialize(make_model(), config(2, world))
    _train(engine, rank, world, range(2))
    expected = engine.full_state_dict()
    engine.save_checkpoint(ckpt, tag="sync")
    engine.save_checkpoint(ckpt, tag="async", async_save=True)
    first = engine._async_saver.buffers.nbytes
    _train(engine, rank, world, range(2, 4))  # changes every state while the background thread writes
    engine.save_checkpoint(ckpt, tag="again", async_save=True)  # waits for the previous, reuses its buffers
    reused = engine._async_saver.buffers.nbytes == first
    engine.wait_for_checkpoint()
    return {"expected": expected, "buffer_bytes": first, "reused": reused}
