"""Rank 0 of an N-rank run on one GPU: torch's fake process group, no peers, no communication.

What one rank of a real N-rank ZeRO run allocates (its 1/N of the optimizer states, its gradient
shards, the same buckets and activations) is what this process allocates, so per-rank memory and the
compute part of the step time can be measured when only one GPU is lent. NCCL's own buffers and the
collectives' time and SM use are absent: this is not a substitute for a real multi-GPU run.

The fake backend's collectives differ between torch releases (some leave outputs untouched), so
zero_core's two flat collectives are replaced by local stand-ins with finite results: the
reduce-scatter keeps rank 0's slice of the local sum, the all-gather writes rank 0's shard.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from zero_core import comm


class _Done:
    def wait(self) -> None:
        return None


def _reduce_scatter(out: torch.Tensor, full: torch.Tensor, op=None, async_op: bool = False):
    out.copy_(full[: out.numel()])
    return _Done() if async_op else None


def _all_gather(full: torch.Tensor, shard: torch.Tensor, async_op: bool = False):
    if full.data_ptr() != shard.data_ptr():  # stages 1-2: the shard already is rank 0's slice of `full`
        full[: shard.numel()].copy_(shard)
    return _Done() if async_op else None


def setup_simulated(world: int) -> tuple[torch.device, int, int]:
    """Init a fake `world`-rank process group as rank 0 on GPU 0; returns (device, rank, world)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE="1")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    comm._reduce_scatter, comm._all_gather = _reduce_scatter, _all_gather
    import zbench.plan  # the plan checks that the machine has `world` GPUs; here one stands for them all

    zbench.plan._check_gpus = lambda gpus, notes, cap: device.type
    return device, 0, world


def setup_from_env() -> tuple[torch.device, int, int]:
    """SIM_WORLD=N: the simulated rank 0 of N; otherwise the launcher's real process group."""
    if os.environ.get("SIM_WORLD"):
        return setup_simulated(int(os.environ["SIM_WORLD"]))
    from zbench.worker import _setup

    return _setup()


def compile_blocks(bundle) -> None:
    """COMPILE=1: the blocks compiled as the scenario key `compile: true` does (inductor)."""
    if os.environ.get("COMPILE"):
        from zbench.models.compiled import compile_blocks as compile_model_blocks

        compile_model_blocks(bundle, "inductor")
