"""What a ZeRO stage decides, as one strategy object per stage family:

- the order of the parameters and the flat layout that shards them (checkpoints/layout.py);
- the flat 16-bit working buffers the parameters become views of;
- its gradient path: which collective reduces a complete bucket, and when (every micro-step, or at the
  accumulation boundary only, keeping full gradients in persistent buckets until then);
- where the optimizer writes the updated 16-bit weights, and how they reach every rank's model.

    replicated.py   stage 0: every rank holds everything; buckets all-reduced at the boundary
    sharded.py      stages 1-2: optimizer states (and gradients at 2) sharded; weights all-gathered per bucket
    partitioned.py  stage 3: weights sharded too, gathered per unit just before use (param_gather.py)

The hooks and buckets that collect gradients are shared (grad_buckets.py); the optimizer, wherever
its states live (zero_core/optim/), is driven the same way by every stage.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from checkpoints.layout import FlatLayout

from .. import comm
from ..config_models import ZeroConfig
from ..optim import PartitionOptimizer


class Stage:
    persistent_buckets = False  # full gradients accumulate in persistent buckets across micro-steps (stages 0-1)
    reduces_every_micro_step = True  # else only at the accumulation boundary
    contiguous = True  # one working buffer for all groups (stage 3 needs one per unit, to free it)

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], layout: FlatLayout, cfg: ZeroConfig,
                 rank: int, device: torch.device) -> None:
        self.model, self.params, self.layout, self.cfg = model, params, layout, cfg
        self.rank, self.device, self.dtype = rank, device, cfg.dtype
        self.full: list[torch.Tensor] = []  # per-group working buffers; the parameters are views of them
        self.output: torch.Tensor | list[torch.Tensor] | None = None  # where the update writes 16-bit weights
        self.local: torch.Tensor | None = None  # a separate 16-bit copy of this rank's partition, if any
        self.uploader: Any = None  # host updates: optim/weight_upload.py's WeightUploader, sending `output` up

    # -- set-up ---------------------------------------------------------------------------------------
    def flatten(self, master: Any) -> None:
        """Move the parameters into flat working buffers and write this rank's fp32 master shard, in
        partition order, through `master` (the state store's writer).

        Masters come from the original fp32 values broadcast from rank 0, not from their 16-bit cast."""
        layout = self.layout
        flat = torch.empty(sum(g.padded_numel for g in layout.groups) if self.contiguous else 0,
                           dtype=self.dtype, device=self.device)
        start = 0
        with torch.no_grad():
            for g in layout.groups:
                staging = torch.zeros(g.padded_numel, dtype=torch.float32, device=self.device)
                for s in g.slots:
                    staging[s.offset : s.offset + s.numel].copy_(self.params[s.index].detach().reshape(-1))
                comm.broadcast_(staging, what=f"broadcast of rank 0's initial weights (group {g.index})")
                lo, hi = layout.shard_range(g.index, self.rank if layout.world_size > 1 else 0)
                master.write(staging[lo:hi])
                if self.contiguous:
                    buf = flat[start : start + g.padded_numel]
                    start += g.padded_numel
                else:
                    buf = torch.empty(g.padded_numel, dtype=self.dtype, device=self.device)
                buf.copy_(staging)
                self.full.append(buf)
                for s in g.slots:
                    self.params[s.index].data = buf[s.offset : s.offset + s.numel].view(s.shape)
        master.close()
        self.flat = flat

    def attach(self, optimizer: PartitionOptimizer, breakdown: Any) -> None:
        """Decide where `optimizer` writes its 16-bit output and how it reaches the model."""
        raise NotImplementedError

    # -- the gradient path ----------------------------------------------------------------------------------
    def reduce(self, bucket: torch.Tensor, group: Any) -> torch.Tensor:
        """Reduce a complete gradient bucket across ranks; this rank's reduced part (on the reduce stream)."""
        if comm.world_size() == 1 and not self.persistent_buckets:
            return bucket  # one rank: a fresh bucket is its own reduction (no copy; it lives until it is taken)
        reduced = torch.empty(group.shard_numel, dtype=bucket.dtype, device=bucket.device)
        comm.reduce_scatter_sum(reduced, bucket, what=f"reduce-scatter of gradient bucket {group.index}")
        return reduced

    def before_backward(self) -> None:
        """A backward is about to run."""

    def on_group_reduced(self, g: int) -> None:
        """Group g's gradients are reduced."""

    def after_backward(self) -> None:
        """Backward and its reductions are queued."""

    # -- the update -----------------------------------------------------------------------------------
    def begin_update(self) -> None:
        """Before the optimizer rewrites the output."""
        self.wait_for_weights()

    publish_chunk: Callable[[int, int], None] | None = None  # host updates: output[lo:hi] is final
    after_segment: Callable[[int], None] | None = None  # device updates: segment i's update is queued

    def finish_update(self) -> None:
        """The optimizer's output is final: make the updated weights visible to the model."""

    def wait_for_weights(self) -> None:
        """Finish weight all-gathers still in flight (stages 1-2 overlap them with the next forward)."""

    def take_edited_weights(self) -> None:
        """Make weights the script changed in place the masters, where the stage keeps them (stage 0, fp32)."""

    def write_partition(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """Write partition elements [lo, hi) of the 16-bit output (after a checkpoint load)."""
        out = self.output
        if out is None:
            return
        if isinstance(out, torch.Tensor):
            out[lo:hi].copy_(values)
            return
        for g, view in zip(self.layout.groups, out):
            a, b = max(lo, g.partition_offset), min(hi, g.partition_offset + g.shard_numel)
            if a < b:
                view[a - g.partition_offset : b - g.partition_offset].copy_(values[a - lo : b - lo])

    def reload(self, states: Any) -> None:
        """Rewrite the working weights from the fp32 masters in `states` (after a checkpoint load)."""
        self.wait_for_weights()
        for lo, hi, v in states.stream(("master",), write_back=False):
            self.write_partition(lo, hi, v["master"])
        if self.uploader is not None:
            self.uploader.begin()
            self.uploader(0, self.layout.partition_numel)
        self.finish_update()

    # -- the caller's own reads and writes of whole parameters (zero_core.deepspeed.zero.GatheredParameters) ------
    def groups_of(self, params: list[torch.Tensor]) -> list[int]:
        slot = {id(p): i for i, p in enumerate(self.params)}
        return sorted({self.layout.slots[slot[id(p)]].group for p in params if id(p) in slot})

    def hold(self, groups: list[int]) -> None:
        """Make `groups`' full weights current and keep them so (stages 1-2: they already are, once gathered)."""
        self.wait_for_weights()

    def let_go(self, groups: list[int]) -> None:
        """The caller is done with `groups`' full weights."""

    def take_modified(self, groups: list[int], src: int, states: Any) -> None:
        """Rank `src` changed `groups`' full weights: every rank takes them, and they become the fp32 masters
        (and this rank's 16-bit output, for host updates)."""
        for g in groups:
            comm.broadcast_(self.full[g], src=src, what=f"broadcast of modified weights (group {g})")
        ranges = {g: self.layout.shard_range(g, self.rank if self.layout.world_size > 1 else 0) for g in groups}
        for lo, hi, v in states.stream(("master",), write_back=True):
            for g, (a, b) in ranges.items():
                group = self.layout.groups[g]
                start, end = max(lo, group.partition_offset), min(hi, group.partition_offset + group.shard_numel)
                if start < end:
                    full = self.full[g][a - group.partition_offset + start : a - group.partition_offset + end]
                    v["master"][start - lo : end - lo].copy_(full)
                    self._after_master_write(start, end, full)

    def _after_master_write(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """Partition elements [lo, hi) of the masters were rewritten from `values` (16-bit): keep copies in step."""
        if isinstance(self.output, torch.Tensor) and self.output.data_ptr() != self.flat.data_ptr():
            self.output[lo:hi].copy_(values)
        if self.local is not None and self.local is not self.output:
            self.local[lo:hi].copy_(values)

    def shard_view(self, g: Any) -> torch.Tensor:
        """This rank's shard of group `g` inside its full working buffer."""
        lo, hi = self.layout.shard_range(g.index, self.rank)
        return self.full[g.index][lo:hi]

    def working_shard_bytes(self) -> int:
        """Bytes of a 16-bit partition kept apart from the working buffers (memory reports)."""
        separate = self.local is not None and self.local.data_ptr() != self.full[0].data_ptr()
        return self.local.numel() * self.local.element_size() if separate else 0

    def close(self) -> None:
        """Detach hooks."""
