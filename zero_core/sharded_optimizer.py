"""This rank's optimizer partition: fp32 master weights, Adam moments and the fp32 gradient partition.

On the device the fp32 gradient exists only between a bucket's first reduction and the step that
consumes it: one tensor per bucket (`segments`), allocated when the bucket is reduced and freed after
the update. Backward frees activations as fast as these fill up, so the gradient partition never
adds to the peak at the end of forward (on GPT-2 XL, 2 ranks: 3.1 GB per GPU less than a persistent one).

The states live in a store (`opt_states.py`); offloaded ones are updated by `HostAdamW` (host_adam.py).
On the device the whole update runs with no host synchronisation: the reduce epilogue leaves a sum of
squares and a non-finite flag in device memory, one small all-reduce makes them global, and the
AdamW kernel reads the clip coefficient, the learning rate, the step count and the skip flag from
device tensors.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from . import comm
from .kernels import adamw_step, reduce_epilogue
from .opt_states import TensorStates


class ShardedAdamW:
    """AdamW over one contiguous fp32 partition of `numel` elements."""

    def __init__(
        self,
        states: TensorStates,
        *,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        decoupled: bool,
        clip: float,
        lr_at: Callable[[torch.Tensor], torch.Tensor],
        shard_stats: bool,
        comm_device: torch.device,
        segments: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        self.states = states
        # (partition offset, numel) of each bucket's shard: the unit of gradient allocation and update
        self.segments = list(segments) if segments else [(0, states.numel)]
        self._parts: dict[int, torch.Tensor] = {}  # partition offset -> that bucket's fp32 gradient
        self._segment_numel = dict(self.segments)
        self.segment_order: list[int] | None = None  # the order segments are updated in (elementwise: any order)
        dev = states.device
        if isinstance(states, TensorStates):  # direct access where the states are tensors
            self.master, self.exp_avg, self.exp_avg_sq = states.master, states.exp_avg, states.exp_avg_sq
        self.grad = self._new_grad(states.numel, dev)
        self.comm_device = comm_device
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay, self.decoupled, self.clip = eps, weight_decay, decoupled, clip
        self.lr_at = lr_at
        self.shard_stats = shard_stats  # False when every rank holds the whole gradient (stage 0)
        self.sumsq = torch.zeros(1, dtype=torch.float32, device=dev)
        self.nonfinite = torch.zeros(1, dtype=torch.int32, device=dev)
        self.applied = torch.zeros(1, dtype=torch.float32, device=dev)  # updates actually applied
        self.skipped = torch.zeros(1, dtype=torch.float32, device=dev)
        self.lr = lr_at(self.applied)
        self.grad_norm = torch.zeros(1, dtype=torch.float32, device=dev)
        self.overflow = torch.zeros(1, dtype=torch.int32, device=dev)

    def _new_grad(self, numel: int, device: torch.device) -> torch.Tensor | None:
        return None  # per-bucket parts, allocated on the first reduction (accumulate)

    def reset_stats(self) -> None:
        """Start a new reduction pass: only the last pass before a step counts for norm and overflow."""
        self.sumsq.zero_()
        self.nonfinite.zero_()

    def accumulate(self, reduced: torch.Tensor, start: int, scale: torch.Tensor, accumulate: bool) -> None:
        """Fold a reduced gradient shard into partition elements [start, start + numel)."""
        if self._segment_numel.get(start) != reduced.numel():
            raise ValueError(f"gradient shard [{start}, {start + reduced.numel()}) is not one of the optimizer's segments")
        acc = self._parts.get(start)
        if acc is None:  # the bucket's first reduction since the last step: nothing to accumulate into
            acc = self._parts[start] = torch.empty(reduced.numel(), dtype=torch.float32, device=reduced.device)
            accumulate = False
        reduce_epilogue(reduced, acc, scale, accumulate, self.sumsq, self.nonfinite)

    def gradient(self, start: int, numel: int) -> torch.Tensor:
        """The fp32 gradient of partition elements [start, start + numel) (one segment); zeros if none arrived."""
        part = self._parts.get(start)
        return part if part is not None else torch.zeros(numel, dtype=torch.float32, device=self.sumsq.device)

    def _local_stats(self) -> torch.Tensor:
        """This rank's [sum of squares, non-finite flag] of the pass that ends at this step."""
        return torch.cat([self.sumsq, self.nonfinite.float()])

    def step(self, out: torch.Tensor | list[torch.Tensor] | None, publish: Callable[[int, int], None] | None = None,
             after_segment: Callable[[int], None] | None = None) -> None:
        """Clip, update and write the working-precision copy into `out` (the partition, or one tensor per
        segment); skipped on a non-finite gradient.

        `publish(lo, hi)` (host steps only) is called once out[lo:hi] holds its final values;
        `after_segment(i)` once segment i's update is queued (stages 1-2 start its all-gather there)."""
        stats = self._local_stats()
        if self.shard_stats:
            comm.all_reduce_sum_on(stats, self.comm_device, what="all-reduce of the gradient norm and overflow flag")
        stats = stats.to(self.sumsq.device)
        self.grad_norm = stats[:1].sqrt()
        self.overflow = (stats[1:] > 0).to(torch.int32)
        if self.clip > 0:
            coef = (self.clip / (self.grad_norm + 1e-6)).clamp(max=1.0)
        else:
            coef = torch.ones_like(self.grad_norm)
        self.lr = self.lr_at(self.applied)
        ok = 1.0 - self.overflow.float()
        self.applied += ok
        self.skipped += 1.0 - ok
        self._update(coef, out, publish, after_segment)

    def _update(self, coef: torch.Tensor, out: torch.Tensor | list[torch.Tensor] | None,
                publish: Callable[[int, int], None] | None, after_segment: Callable[[int], None] | None = None) -> None:
        current = torch.cuda.current_stream(self.sumsq.device) if self.sumsq.is_cuda else None
        for i in self.segment_order or range(len(self.segments)):
            lo, n = self.segments[i]
            grad = self.gradient(lo, n)
            if current is not None:
                grad.record_stream(current)  # allocated on the reduce stream, last read here
            hi = lo + n
            adamw_step(
                self.master[lo:hi], grad, self.exp_avg[lo:hi], self.exp_avg_sq[lo:hi],
                None if out is None else out[i] if isinstance(out, list) else out[lo:hi],
                lr=self.lr, step=self.applied, coef=coef, skip=self.overflow,
                beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                weight_decay=self.weight_decay, decoupled=self.decoupled,
            )
            if after_segment is not None:
                after_segment(i)
        self._parts = {}  # freed once the update kernels have read them (stream-ordered)

    def persistent_bytes(self) -> int:
        """Bytes this optimizer keeps between steps: master and moments (gradients are transient)."""
        return sum(t.numel() * t.element_size() for t in (self.master, self.exp_avg, self.exp_avg_sq))

    def close(self) -> None:
        self.states.close()
