"""Partial optimizer offload (`offload_optimizer.ratio` < 1): the first buckets of this rank's partition keep
their states on the device and are updated by the fused kernel (DeviceAdamW); the rest live on the host and
are updated there (HostAdamW). Both run in the same step: the device kernels are queued first, so they run
while the host updates its share.

Which buckets stay on the device: the first ones in partition order, which is forward order (embeddings,
then block by block; at stage 3 the root unit, then the blocks): the next forward needs them first, and the
host's share, last in the forward, has the most time to arrive.

One step, one result: the gradient norm and the non-finite flag are accumulated for every bucket in the
host update's own accumulators, the same way and in the same order as a fully offloaded run takes them (a
vector norm per shard where the reduced shard lies; in fold-sized pieces of the fp32 gradient under
accumulation), so a split run equals the fully offloaded one bitwise on the CPU, clipping and skipped
steps included. Both parts share the step's counters, learning rates and hyper-parameters.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..kernels import cpu as host_kernels
from .base import Output, PartitionOptimizer, Publish
from .device_adam import DeviceAdamW
from .host_adam import FOLD_CHUNK_NUMEL, HostAdamW
from .param_groups import Run
from .split_states import SplitStates


def device_segment_count(runs: list[list[Run]], ratio: float) -> int:
    """How many leading segments stay on the device when `ratio` of the partition is offloaded: the most whose
    elements are at most (1 - ratio) of the partition (so some share always goes to the host)."""
    total = runs[-1][-1][1] if runs else 0
    budget, count = (1.0 - ratio) * total, 0
    for seg in runs:
        if seg[-1][1] > budget:
            break
        count += 1
    return min(count, max(len(runs) - 1, 0))


def empty_share_note(runs: list[list[Run]], ratio: float) -> str:
    """One line for a ratio below 1 whose device share `device_segment_count` left empty (with several segments):
    what the user asked for silently became full offload otherwise."""
    total, first = runs[-1][-1][1], runs[0][-1][1]
    most = math.floor((1.0 - first / total) * 1000) / 1000
    return (f"zero_core: offload_optimizer.ratio {ratio:g} keeps no optimizer states on the device: the first bucket "
            f"({first:,} elements) is {first / total:.1%} of the partition, more than the {1 - ratio:.1%} asked for; "
            f"a ratio of at most {most:g} keeps it (or a smaller reduce_bucket_size splits it)")


class SplitAdamW(PartitionOptimizer):
    """Partition elements [0, split) updated on the device, [split, numel) on the host (`states`: SplitStates)."""

    on_host = True  # the stage keeps the host output buffer and its uploader; the device share writes in place

    def __init__(self, states: SplitStates, device_opt: DeviceAdamW, host_opt: HostAdamW, **kw) -> None:
        super().__init__(states, **kw)
        self.split = states.split
        self.device_opt, self.host_opt = device_opt, host_opt
        self.breakdown = host_opt.breakdown
        self._device_out: Output = None  # where the device share writes its 16-bit weights (bound by the stage)
        self._staged_out: torch.Tensor | None = None  # a device buffer when that place is in host memory
        self._host_copy_target: torch.Tensor | None = None  # ... and the host place it is copied down to
        host_opt.counts = lambda: self.applied  # speculative host updates read this step's counters
        self.auto = None  # ratio "auto": auto_ratio.AutoOffload, until the first step has been measured
        self._bound: torch.Tensor | list[torch.Tensor] | None = None

    def bind_device_output(self, out: torch.Tensor | list[torch.Tensor]) -> None:
        """The device share's 16-bit output: one view per device segment, or the flat partition (stage 3)."""
        self._bound = out
        if isinstance(out, list):
            self._device_out = out[: len(self.device_opt.segments)]
            return
        if out.device.type == self.states.device.type:
            self._device_out = out
            return
        self._staged_out = torch.empty(self.split, dtype=out.dtype, device=self.states.device)
        self._device_out = self._staged_out
        self._host_copy_target = out[: self.split]  # parameter offload: the shard is copied down after the update

    def take_over(self, old: SplitAdamW) -> None:
        """Continue `old`'s run (ratio "auto" re-split it): its counters, schedule and device output."""
        for name in ("applied", "skipped", "grad_norm", "overflow", "lr", "lr_at", "facade"):
            setattr(self, name, getattr(old, name))
        if old._bound is not None:
            self.bind_device_output(old._bound)
        self.host_opt.run_update, self.host_opt.adam_key = old.host_opt.run_update, old.host_opt.adam_key
        old.host_opt._folder.close()

    def run_host_update_with(self, launch: Callable[[Callable[[], None]], None]) -> bool:
        return self.host_opt.run_host_update_with(launch)

    # -- a reduction pass ----------------------------------------------------------------------------
    def begin_pass(self, scale: torch.Tensor, accumulate: bool, final: bool) -> None:
        super().begin_pass(scale, accumulate, final)
        self.device_opt.begin_pass(scale, accumulate, final)
        self.host_opt.lr_at = self.lr_at  # None while a host schedule writes the lr
        self.host_opt.begin_pass(scale, accumulate, final)

    def receive(self, reduced: torch.Tensor, offset: int) -> None:
        if offset >= self.split:
            self.host_opt.receive(reduced, offset - self.split)
            return
        host = self.host_opt
        self.device_opt.receive(reduced, offset)
        if host.lazy:  # the statistics a fully offloaded run takes, in the same place and order
            assert self.scale is not None
            host.reduced_stats(reduced)
            return
        acc = self.device_opt.gradient(offset, reduced.numel())
        sums = torch.stack([host_kernels.sum_of_squares(p) for p in acc.split(FOLD_CHUNK_NUMEL)])  # the fold's pieces
        landed = None
        if sums.is_cuda:
            landed = torch.cuda.Event()
            landed.record()
        host._folder.submit(landed, lambda: host_kernels.add_sums(sums.cpu(), host.sumsq, host.nonfinite))

    def end_pass(self) -> None:
        self.device_opt.end_pass()
        self.host_opt.end_pass()

    def _local_stats(self) -> torch.Tensor:
        return self.host_opt._local_stats()

    # -- the update ------------------------------------------------------------------------------------
    def _update(self, coef: torch.Tensor, out: Output, publish: Publish | None,
                after_segment: Callable[[int], None] | None = None) -> None:
        dev, host = self.device_opt, self.host_opt
        # the host's copies are read before the device share is queued: reading them after would make the host
        # wait for the device's update kernels instead of running beside them
        host.lr, host.applied, host.overflow = self.lr.cpu(), self.applied.cpu(), self.overflow.cpu()
        host_coef = coef.cpu()
        dev.lr, dev.applied, dev.overflow = self.lr, self.applied, self.overflow
        with self.breakdown.device("gpu_adam"):
            dev._update(coef, self._device_out, None, None)  # queued: runs while the host updates its share
        if self._staged_out is not None and self._host_copy_target is not None:
            self._host_copy_target.copy_(self._staged_out, non_blocking=True)
        if publish is not None:
            publish(self.split, self.split)  # gathers the buckets the device share holds alone
        assert out is None or isinstance(out, torch.Tensor)
        shifted = None if publish is None else (lambda a, b: publish(a + self.split, b + self.split))
        host._update(host_coef, None if out is None else out[self.split :], shifted)

    def gradient_of(self, lo: int, hi: int) -> torch.Tensor:
        s = self.split
        device = [self.device_opt.gradient_of(lo, min(hi, s)).cpu()] if lo < s else []
        host = [self.host_opt.gradient_of(max(lo, s) - s, hi - s)] if hi > s else []
        return torch.cat(device + host)

    def undo_speculation(self) -> None:
        self.host_opt.undo_speculation()

    def live_gradient_bytes(self) -> int:
        return self.device_opt.live_gradient_bytes() + self.host_opt.live_gradient_bytes()

    def device_state_numel(self) -> int:
        return self.split

    def close(self) -> None:
        self.host_opt._folder.close()
        self.states.close()
