"""Stages 1-2: optimizer states sharded (stage 1), and gradients too (stage 2).

Every rank keeps the full 16-bit weights in one flat working buffer, cut into buckets of
`reduce_bucket_size` elements, each padded to split evenly into per-rank shards.

Gradient path. Stage 1 accumulates full gradients in persistent buckets and reduce-scatters them at
the accumulation boundary. Stage 2 reduce-scatters each bucket as soon as it is complete, every
micro-step, so a rank holds only its shard of the gradients (grad_buckets.py collects them; the
optimizer folds each reduced shard into its fp32 gradient).

Weights. The update writes each bucket's shard straight into the full buffer (no separate 16-bit
partition) and an all-gather completes it in place. Without offload each bucket's all-gather starts as
soon as its shard is updated and the next forward waits per module (deferred_gather.py,
`zero_core.overlap_weight_gather`); with optimizer offload the host step writes a pinned host buffer,
each chunk is copied up as soon as it exists and each bucket is gathered once its chunks are up
(optim/weight_upload.py).
"""

from __future__ import annotations

from typing import Any

from .. import comm
from ..optim.weight_upload import WeightUploader
from .base import Stage
from .deferred_gather import DeferredWeightGather
from .host_step_overlap import HostStepInFlight
from .units import block_units, units_as_buckets


class ShardedStage(Stage):
    def __init__(self, model, params, layout, cfg, rank, device) -> None:
        super().__init__(model, params, layout, cfg, rank, device)
        self.persistent_buckets = cfg.stage == 1
        self.reduces_every_micro_step = cfg.stage == 2
        self.deferred: DeferredWeightGather | None = None
        self.inflight: HostStepInFlight | None = None  # offload: the host update still running (host_step_overlap.py)
        self._gathered_to = 0  # with `inflight`: buckets [0, this) are all-gathered since the update began

    def attach(self, optimizer: Any, breakdown: Any) -> None:
        groups = self.layout.groups
        if optimizer.on_host:  # the host's 16-bit output, uploaded into the shards as it is produced
            self.output = comm.host_buffer(self.layout.partition_numel, self.dtype, pin=self.device.type == "cuda")
            for g in groups:
                self.output[g.partition_offset : g.partition_offset + g.shard_numel].copy_(self.shard_view(g))
            ends = [g.partition_offset + g.shard_numel for g in groups]
            self.uploader = WeightUploader(
                self.output,
                [(g.partition_offset, self.shard_view(g)) for g in groups],
                breakdown,
                ends,
                gather=lambda i: self._all_gather(groups[i]),
            )
            self.publish_chunk = self.uploader
            optimizer.bind_device_output([self.shard_view(g) for g in groups])  # a share kept on the device (ratio < 1)
            if self.cfg.zero_core.overlap_weight_gather:  # the host update runs on while the next forward starts
                inflight = HostStepInFlight(self._bucket_units(), ends, self.model, breakdown, uploader=self.uploader,
                                            gather=self._gather_in_order)
                if optimizer.run_host_update_with(inflight.launch):
                    self.inflight, self.publish_chunk = inflight, inflight.publish
                else:
                    inflight.remove()
            return
        self.output = [self.shard_view(g) for g in groups]  # one view per optimizer segment
        if self.cfg.zero_core.overlap_weight_gather and self.layout.world_size > 1:
            bucket_units = self._bucket_units()
            self.deferred = DeferredWeightGather(bucket_units, self._start_gather, self.model)
            self.after_segment = self.deferred.start
            # update (and so gather) first the buckets the model reads before its first block, then the rest
            # in forward order: the first forward waits only for those
            first = sorted(bucket_units[0][1]) if bucket_units else []
            optimizer.segment_order = first + [i for i in range(len(groups)) if i not in first]

    def _bucket_units(self) -> list:
        """(module, the buckets its forward reads) per unit: the root unit, then the blocks (units.py)."""
        unit_params, bounds, units = block_units(self.model, {id(p) for p in self.params})
        return units_as_buckets(units, unit_params, bounds, self.params, self.layout)

    def _start_gather(self, bucket: int) -> comm.PendingCollective:
        g = self.layout.groups[bucket]
        return comm.all_gather_flat_async(
            self.full[g.index], self.shard_view(g), what=f"all-gather of updated weights (bucket {g.index})"
        )

    def _gather_in_order(self, bucket: int) -> None:
        """With `inflight`: a forward that needs `bucket` all-gathers it and every bucket before it not gathered
        yet (all published: the update publishes in partition order), in index order. Every rank then issues
        the same all-gathers in the same order even where the ranks' forwards read different buckets (a branch
        one rank takes and another does not)."""
        while self._gathered_to <= bucket:
            self._all_gather(self.layout.groups[self._gathered_to])
            self._gathered_to += 1

    def _all_gather(self, g: Any) -> None:
        comm.all_gather_flat(
            self.full[g.index], self.shard_view(g), what=f"all-gather of updated weights (bucket {g.index})"
        )

    def begin_update(self) -> None:
        if self.uploader is not None:
            self.uploader.begin()
        self.wait_for_weights()  # the update rewrites the shards the last gathers read
        if self.inflight is not None:
            self.inflight.begin()
            self._gathered_to = 0

    def finish_update(self) -> None:
        if self.inflight is not None:
            self.inflight.end_step()  # the forward gathers what the update thread publishes
        elif self.uploader is not None:
            self.uploader.finish()  # and all-gathers the buckets not gathered yet
        elif self.deferred is None:
            for g in self.layout.groups:
                self._all_gather(g)

    def wait_for_weights(self) -> None:
        if self.deferred is not None:
            self.deferred.wait_all()
        if self.inflight is not None:
            self.inflight.finish()

    def reload(self, states: Any) -> None:
        super().reload(states)
        if self.deferred is not None:  # nothing was started per segment: gather every bucket now
            for g in self.layout.groups:
                self._all_gather(g)

    def close(self) -> None:
        if self.deferred is not None:
            self.deferred.remove()
        if self.inflight is not None:
            self.inflight.remove()
