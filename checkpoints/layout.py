"""The flat layout: where every parameter lives in the flat buffers and which bytes each rank owns.

Parameters are packed, in order, into *groups* (the unit of communication: a reduce bucket for stages
0-2, a module for stage 3). Each group is one contiguous flat range padded so that it splits into
`world_size` equal shards whose size is a multiple of `align` elements. Rank r owns shard r of every
group; a rank's *partition* is the concatenation of its shards, so the fp32 master, the Adam moments
and the 16-bit working copy of a rank are each one contiguous tensor. Every stage, the checkpoint
writer and the converters use this module; nobody re-derives partitions by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

DEFAULT_ALIGN = 64  # elements: keeps every shard start 128-byte aligned for 16-bit vector loads


@dataclass(frozen=True)
class ParamSlot:
    """One parameter's place: `index` in the parameter list, its group, and its flat range inside the group."""

    index: int
    name: str
    shape: tuple[int, ...]
    group: int
    offset: int  # element offset inside the group's full (unsharded) flat buffer
    numel: int


@dataclass(frozen=True)
class Fragment:
    """A piece of one parameter held by one rank: parameter elements [param_start, param_start+numel)
    live at [partition_offset, partition_offset+numel) of that rank's partition."""

    param_index: int
    name: str
    param_start: int
    partition_offset: int
    numel: int


@dataclass(frozen=True)
class Group:
    """A contiguous run of parameters communicated together."""

    index: int
    slots: tuple[ParamSlot, ...]
    padded_numel: int  # full flat size, a multiple of world_size * align
    shard_numel: int  # padded_numel // world_size
    partition_offset: int  # where this group's shard starts inside every rank's partition

    @property
    def numel(self) -> int:
        """Elements actually used by parameters (the rest is padding)."""
        return sum(s.numel for s in self.slots)


@dataclass(frozen=True)
class FlatLayout:
    """Groups of parameters, their padding and each rank's shard; pure arithmetic, no tensors."""

    world_size: int
    align: int
    groups: tuple[Group, ...]
    slots: tuple[ParamSlot, ...] = field(repr=False)

    @property
    def partition_numel(self) -> int:
        """Elements in each rank's partition (the same on every rank)."""
        return sum(g.shard_numel for g in self.groups)

    @property
    def numel(self) -> int:
        """Parameter elements, padding excluded."""
        return sum(s.numel for s in self.slots)

    def shard_range(self, group: int, rank: int) -> tuple[int, int]:
        """[start, end) of `rank`'s shard inside `group`'s full flat buffer."""
        g = self.groups[group]
        return rank * g.shard_numel, (rank + 1) * g.shard_numel

    def fragments(self, rank: int) -> list[Fragment]:
        """The pieces of parameters that `rank` holds, in partition order."""
        out: list[Fragment] = []
        for g in self.groups:
            lo, hi = self.shard_range(g.index, rank)
            for s in g.slots:
                start, end = max(lo, s.offset), min(hi, s.offset + s.numel)
                if start < end:
                    out.append(
                        Fragment(s.index, s.name, start - s.offset, g.partition_offset + start - lo, end - start)
                    )
        return out


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build_layout(
    params: Sequence[tuple[str, torch.Size | Sequence[int]]],
    world_size: int,
    group_bounds: Sequence[int] | None = None,
    bucket_numel: int | None = None,
    align: int = DEFAULT_ALIGN,
) -> FlatLayout:
    """Lay out `params` (name, shape) for `world_size` ranks.

    Groups come from `group_bounds` (indices where a new group starts; stage 3 passes module
    boundaries) or, if absent, by closing a group once it holds `bucket_numel` elements. Each
    parameter starts `align`-aligned inside its group so its 16-bit view is vector-loadable.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    starts = set(group_bounds or [])
    groups: list[Group] = []
    all_slots: list[ParamSlot] = []
    pending: list[ParamSlot] = []
    cursor = 0
    partition_offset = 0

    def close() -> None:
        nonlocal pending, cursor, partition_offset
        if not pending:
            return
        padded = _round_up(max(cursor, 1), world_size * align)
        shard = padded // world_size
        groups.append(Group(len(groups), tuple(pending), padded, shard, partition_offset))
        partition_offset += shard
        pending, cursor = [], 0

    for i, (name, shape) in enumerate(params):
        if i in starts:
            close()
        numel = 1
        for d in shape:
            numel *= int(d)
        slot = ParamSlot(i, name, tuple(int(d) for d in shape), len(groups), cursor, numel)
        pending.append(slot)
        all_slots.append(slot)
        cursor = _round_up(cursor + numel, align)
        if group_bounds is None and bucket_numel is not None and cursor >= bucket_numel:
            close()
    close()
    return FlatLayout(world_size, align, tuple(groups), tuple(all_slots))
