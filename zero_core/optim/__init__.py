"""Where a rank's optimizer states live, and the update that goes with them: the offload strategy.

    device (default)        DeviceAdamW: fp32 master and moments on the GPU, fused Triton kernels
    offload_optimizer cpu   HostAdamW over states in host memory: torch's fused CPU Adam in chunks
    offload_optimizer nvme  HostAdamW over states in one file per rank on NVMe, streamed chunk by chunk

Every one honours the same interface (base.py), which the gradient reducer and the engine call.
"""

from __future__ import annotations

import torch

from ..config_models import AioConfig, ZeroConfig
from ..lr_schedules import make_lr_schedule
from ..step_timer import StepBreakdown
from . import affinity, nvme_states
from .base import PartitionOptimizer
from .device_adam import DeviceAdamW
from .host_adam import HostAdamW
from .states import make_states

__all__ = ["PartitionOptimizer", "DeviceAdamW", "HostAdamW", "make_optimizer", "offloads_optimizer"]


def offloads_optimizer(cfg: ZeroConfig) -> bool:
    off = cfg.zero_optimization.offload_optimizer
    return off is not None and off.device in ("cpu", "nvme")


def make_optimizer(cfg: ZeroConfig, layout, device: torch.device, rank: int, breakdown: StepBreakdown) -> PartitionOptimizer:
    """The optimizer for this rank's partition of `layout`, its states placed as the config says."""
    zero = cfg.zero_optimization
    states = make_states(layout.partition_numel, device, zero.offload_optimizer, cfg.aio or zero.aio or AioConfig(), rank)
    opt = cfg.optimizer
    hyper = dict(betas=tuple(opt.params.betas), eps=opt.params.eps, weight_decay=opt.params.weight_decay,
                 decoupled=opt.decoupled, clip=float(cfg.gradient_clipping or 0.0), lr_at=make_lr_schedule(cfg),
                 shard_stats=cfg.stage > 0, comm_device=device)
    if offloads_optimizer(cfg):
        return HostAdamW(states, comm_dtype=cfg.comm_dtype, breakdown=breakdown, **hyper)
    return DeviceAdamW(states, segments=[(g.partition_offset, g.shard_numel) for g in layout.groups], **hyper)
