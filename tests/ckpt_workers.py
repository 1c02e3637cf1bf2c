"""Rank functions for the checkpoint tests: train, save, resume on another world size or stage."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from parity_workers import ds_config, make_batches, make_model

GLOBAL_BATCH = 6
STEPS = 6
CKPT_LR = 1e-4  # small steps keep Adam's amplification of reduction-order noise far under 1e-6


def config(stage: int, world: int, offload: bool | str = False) -> dict:
    """offload: False, True (host memory) or "nvme" (states in a fresh temporary folder, in small chunks)."""
    cfg = ds_config(stage, "fp32", GLOBAL_BATCH // world)
    if offload == "nvme":
        import tempfile

        os.environ.update(ZERO_CORE_HOST_CHUNK_NUMEL="1024", ZERO_CORE_NVME_CHUNK_NUMEL="2048")
        cfg["zero_optimization"]["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": tempfile.mkdtemp(prefix="zb-nvme-"),
        }
    elif offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg["optimizer"]["params"]["lr"] = CKPT_LR
    return cfg


def _train(engine, rank: int, world: int, steps: range) -> list[float]:
    micro = GLOBAL_BATCH // world
    batches = make_batches(STEPS, GLOBAL_BATCH)
    losses = []
    for s in steps:
        x, y = batches[s]
        loss = engine(x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro]).loss
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(mean)
        losses.append(float(mean) / world)
    return losses


def uninterrupted_and_save(rank: int, world: int, stage: int, ckpt: str, save_at: int) -> dict:
    """Train STEPS steps straight through; separately train `save_at` steps and save."""
    import zero_core

    full = zero_core.initialize(make_model(), config(stage, world))
    losses = _train(full, rank, world, range(STEPS))
    state = full.full_state_dict()
    part = zero_core.initialize(make_model(), config(stage, world))
    _train(part, rank, world, range(save_at))
    part.save_checkpoint(ckpt, client_state={"next_batch": save_at})
    return {"losses": losses, "state": state, "saved_state": part.full_state_dict()}


def _drop_nvme_dir(cfg: dict) -> None:
    """The engine's state file has no name (unlinked at creation): its temporary folder can go at once."""
    section = cfg["zero_optimization"].get("offload_optimizer") or {}
    if section.get("device") == "nvme":
        os.rmdir(section["nvme_path"])  # fails if anything was left in it


def save_from_nvme(rank: int, world: int, stage: int, ckpt: str, save_at: int) -> dict:
    """Train `save_at` steps with optimizer states on NVMe and save."""
    import zero_core

    cfg = config(stage, world, "nvme")
    engine = zero_core.initialize(make_model(), cfg)
    _drop_nvme_dir(cfg)
    _train(engine, rank, world, range(save_at))
    engine.save_checkpoint(ckpt, client_state={"next_batch": save_at})
    state = engine.full_state_dict()
    engine.close()
    return {"saved_state": state}


def resume(rank: int, world: int, stage: int, ckpt: str, offload: bool | str = False) -> dict:
    """Load the latest checkpoint into a fresh engine and train to STEPS."""
    import zero_core

    cfg = config(stage, world, offload)
    engine = zero_core.initialize(make_model(), cfg)
    _drop_nvme_dir(cfg)
    _, client = engine.load_checkpoint(ckpt)
    start = client["next_batch"]
    assert engine.global_step == start
    losses = _train(engine, rank, world, range(start, STEPS))
    return {"losses": losses, "state": engine.full_state_dict(), "global_step": engine.global_step}


def crash_during_second_save(rank: int, world: int, stage: int, ckpt: str) -> None:
    """Save once, train on, then die on rank 1 in the middle of writing the second save."""
    import zero_core
    from zero_core import checkpointing

    engine = zero_core.initialize(make_model(), config(stage, world))
    _train(engine, rank, world, range(2))
    engine.save_checkpoint(ckpt, client_state={"next_batch": 2})
    torch.save(engine.full_state_dict(), os.path.join(ckpt, f"expected_rank{rank}.pt"))
    _train(engine, rank, world, range(2, 3))
    real_write = checkpointing._write_synced

    def dying_write(tensors, path):
        if rank == 1:
            with open(path, "wb") as f:  # half a file, then the process is gone
                f.write(b"\0" * 100)
            os._exit(17)
        return real_write(tensors, path)

    checkpointing._write_synced = dying_write
    engine.save_checkpoint(ckpt, client_state={"next_batch": 3})
