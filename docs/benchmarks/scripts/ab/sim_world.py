"""Rank 0 of an N-rank run on one GPU for the probe scripts: zbench's `--simulate-ranks` set-up.

What one rank of a real N-rank ZeRO run allocates (its 1/N of the optimizer states, its gradient
shards, the same buckets and activations) is what this process allocates, so per-rank memory and the
compute part of the step time can be measured when only one GPU is lent. NCCL's own buffers and the
collectives' time and SM use are absent: this is not a substitute for a real multi-GPU run.
(zero_core/comm.py writes each flat collective's own share under torch's fake process group; the
first runs of 2026-11-23 patched the same stand-ins in from here, before they moved there.)
"""

from __future__ import annotations

import os

import torch


def setup_simulated(world: int) -> tuple[torch.device, int, int]:
    """Init a fake `world`-rank process group as rank 0 on GPU 0; returns (device, rank, world)."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE="1")
    from zbench.worker import _setup

    return _setup(simulate=world)


def setup_from_env() -> tuple[torch.device, int, int]:
    """SIM_WORLD=N: the simulated rank 0 of N; otherwise the launcher's real process group."""
    if os.environ.get("SIM_WORLD"):
        return setup_simulated(int(os.environ["SIM_WORLD"]))
    from zbench.worker import _setup

    return _setup()


def plan_for(path: str, name: str, world: int):
    """The scenario's plan for one variant: simulated with SIM_WORLD (one GPU stands for `world`), else real."""
    from zbench.plan import build_plan

    if os.environ.get("SIM_WORLD"):
        return build_plan(path, only=[name], simulate=world)
    return build_plan(path, only=[name], gpus=world)


def compile_blocks(bundle) -> None:
    """COMPILE=1: the blocks compiled as the scenario key `compile: true` does (inductor)."""
    if os.environ.get("COMPILE"):
        from zbench.models.compiled import compile_blocks as compile_model_blocks

        compile_model_blocks(bundle, "inductor")
