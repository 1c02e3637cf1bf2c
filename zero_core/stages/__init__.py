"""The ZeRO stages as strategies (base.py says what each decides); `make_stage` builds the one a config asks for."""

from __future__ import annotations

import torch

from checkpoints.layout import FlatLayout, build_layout

from ..config_models import ZeroConfig
from ..optim.param_groups import order_within
from .base import Stage
from .partitioned import PartitionedStage
from .replicated import ReplicatedStage
from .sharded import ShardedStage
from .units import block_units

__all__ = ["Stage", "make_stage"]


def make_stage(
    model: torch.nn.Module,
    cfg: ZeroConfig,
    world_size: int,
    rank: int,
    device: torch.device,
    group_of: dict[int, int] | None = None,
) -> Stage:
    """The stage strategy for `model`'s trainable parameters, with their order and flat layout.

    `group_of` maps id(parameter) to its optimizer group: with several groups each bucket (each stage-3 unit)
    lists its parameters group by group, so every shard holds one run per group (optim/param_groups.py)."""
    named = {id(p): n for n, p in model.named_parameters()}
    trainable = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters; unfreeze some (requires_grad=True) before initialize")
    grouped = group_of is not None and len(set(group_of.values())) > 1

    def layout_of(params: list, bounds: list[int] | None, world: int) -> FlatLayout:
        bucket = None if bounds is not None else _bucket_numel(cfg, sum(p.numel() for p in params))
        layout = build_layout(
            [(named[id(p)], p.shape) for p in params], world, group_bounds=bounds, bucket_numel=bucket
        )
        return layout

    if cfg.stage == 3:  # one group per unit, so each unit can be gathered and freed on its own
        params, bounds, units = block_units(model, {id(p) for p in trainable})
        if grouped:
            params = order_within(params, bounds, group_of)
        return PartitionedStage(model, params, layout_of(params, bounds, world_size), cfg, rank, device, units)
    layout_world = 1 if cfg.stage == 0 else world_size  # stage 0: every rank holds everything
    layout = layout_of(trainable, None, layout_world)
    if grouped:  # the same buckets, each listing its parameters group by group
        trainable = order_within(trainable, [g.slots[0].index for g in layout.groups], group_of)
        layout = layout_of(trainable, [g.slots[0].index for g in layout.groups], layout_world)
    kind = ReplicatedStage if cfg.stage == 0 else ShardedStage
    return kind(model, trainable, layout, cfg, rank, device)


# Partial offload splits the partition at a bucket boundary: at least this many buckets give the split
# ratio a granularity of a few percent, even under DeepSpeed's 5e8-element default bucket.
SPLIT_BUCKETS = 32


def _bucket_numel(cfg: ZeroConfig, total: int) -> int:
    bucket = cfg.zero_optimization.reduce_bucket_size
    off = cfg.zero_optimization.offload_optimizer
    if off is not None and off.device != "none" and off.ratio != 1.0:
        bucket = min(bucket, max(1, -(-total // SPLIT_BUCKETS)))
    return bucket
