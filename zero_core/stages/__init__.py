"""The ZeRO stages as strategies (base.py says what each decides); `make_stage` builds the one a config asks for."""

from __future__ import annotations

import torch

from checkpoints.layout import build_layout

from ..config_models import ZeroConfig
from .base import Stage
from .partitioned import PartitionedStage
from .replicated import ReplicatedStage
from .sharded import ShardedStage
from .units import block_units

__all__ = ["Stage", "make_stage"]


def make_stage(model: torch.nn.Module, cfg: ZeroConfig, world_size: int, rank: int, device: torch.device) -> Stage:
    """The stage strategy for `model`'s trainable parameters, with their order and flat layout."""
    named = {id(p): n for n, p in model.named_parameters()}
    trainable = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters; unfreeze some (requires_grad=True) before initialize")
    if cfg.stage == 3:  # one group per unit, so each unit can be gathered and freed on its own
        params, bounds, units = block_units(model, {id(p) for p in trainable})
        layout = build_layout([(named[id(p)], p.shape) for p in params], world_size, group_bounds=bounds)
        return PartitionedStage(model, params, layout, cfg, rank, device, units)
    layout_world = 1 if cfg.stage == 0 else world_size  # stage 0: every rank holds everything
    layout = build_layout([(named[id(p)], p.shape) for p in trainable], layout_world,
                          bucket_numel=cfg.zero_optimization.reduce_bucket_size)
    kind = ReplicatedStage if cfg.stage == 0 else ShardedStage
    return kind(model, trainable, layout, cfg, rank, device)
