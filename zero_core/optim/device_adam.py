"""The optimizer step on the device: this rank's partition updated by the fused Triton kernels.

The fp32 gradient exists only between a bucket's first reduction and the step that consumes it: one
tensor per bucket (`segments`), allocated when the bucket is reduced and freed after the update.
Backward frees activations as fast as these fill up, so the gradient partition never adds to the peak
at the end of forward (on GPT-2 XL, 2 ranks: 3.1 GB per GPU less than a persistent one).

Each received shard goes through the reduce epilogue (kernels/: scale, accumulate to fp32, sum of
squares, non-finite flag in one pass); the step runs the fused AdamW kernel per segment, reading the
clip coefficient, learning rate, step count and skip flag from device memory: no host sync.

A parameter whose `.grad` is None at a stage-0 step (frozen after `initialize`) is left out of it as torch's AdamW
leaves it out: the stage names its range in `held` for that step, and the updates it missed are counted in `lags`,
so that once it trains again its bias corrections start from its own step count. Without either, the update is
one kernel per run as ever.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..kernels import adamw_step, reduce_epilogue
from .base import Output, PartitionOptimizer, Publish


class DeviceAdamW(PartitionOptimizer):
    """AdamW whose fp32 states are tensors on the device (`states`: optim/states.py's TensorStates)."""

    def __init__(self, states, **kw) -> None:
        super().__init__(states, **kw)
        self.master = states.master
        # (partition offset, numel) of each bucket's shard: the unit of gradient allocation and update
        self.segments = [(runs[0][0], runs[-1][1] - runs[0][0]) for runs in self.runs]
        self._segment_numel = dict(self.segments)
        self._parts: dict[int, torch.Tensor] = {}  # partition offset -> that bucket's fp32 gradient
        self.segment_order: list[int] | None = None  # the order segments are updated in (elementwise: any order)
        self.held: list[tuple[int, int]] = []  # partition ranges the next update leaves alone (set by the stage)
        self.lags: dict[tuple[int, int], torch.Tensor] = {}  # range -> updates it missed while held

    def receive(self, reduced: torch.Tensor, offset: int) -> None:
        """Fold a reduced gradient shard into partition elements [offset, offset + numel)."""
        assert self.scale is not None, "receive() outside a reduction pass"
        if self._segment_numel.get(offset) != reduced.numel():
            raise ValueError(
                f"gradient shard [{offset}, {offset + reduced.numel()}) is not one of the optimizer's segments"
            )
        acc = self._parts.get(offset)
        accumulate = self.accumulate
        if acc is None:  # the bucket's first reduction since the last step: nothing to accumulate into
            acc = self._parts[offset] = torch.empty(reduced.numel(), dtype=torch.float32, device=reduced.device)
            accumulate = False
        reduce_epilogue(reduced, acc, self.scale, accumulate, self.sumsq, self.nonfinite)

    def gradient(self, start: int, numel: int) -> torch.Tensor:
        """The fp32 gradient of partition elements [start, start + numel) (one segment); zeros if none arrived."""
        part = self._parts.get(start)
        return part if part is not None else torch.zeros(numel, dtype=torch.float32, device=self.sumsq.device)

    def gradient_of(self, lo: int, hi: int) -> torch.Tensor:
        pieces = [self.gradient(start, n)[max(lo, start) - start : min(hi, start + n) - start]
                  for start, n in self.segments if start < hi and start + n > lo]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _update(
        self, coef: torch.Tensor, out: Output, publish: Publish | None, after_segment: Callable[[int], None] | None
    ) -> None:
        current = torch.cuda.current_stream(self.sumsq.device) if self.sumsq.is_cuda else None
        steps = self._range_steps() if self.held or self.lags else None
        for i in self.segment_order or range(len(self.segments)):
            start, n = self.segments[i]
            grad = self.gradient(start, n)
            if current is not None:
                grad.record_stream(current)  # allocated on the reduce stream, last read here
            seg_out = None if out is None else out[i] if isinstance(out, list) else out[start : start + n]
            runs = self.runs[i] if steps is None else _pieces(self.runs[i], steps)
            for lo, hi, g, *own in runs:  # one run per optimizer group in this segment (pieces: see _range_steps)
                h = self.groups[g]
                step = own[0] if own else self.applied
                if step is None:
                    continue  # a held range: nothing of it is written
                adamw_step(
                    self.master[lo:hi],
                    grad[lo - start : hi - start],
                    self.states.exp_avg[lo:hi],
                    self.states.exp_avg_sq[lo:hi],
                    None if seg_out is None else seg_out[lo - start : hi - start],
                    lr=self.lr[g : g + 1],
                    step=step,
                    coef=coef,
                    skip=self.overflow,
                    beta1=h.beta1,
                    beta2=h.beta2,
                    eps=h.eps,
                    weight_decay=h.weight_decay,
                    decoupled=self.decoupled,
                )
            if after_segment is not None:
                after_segment(i)
        self._parts = {}  # freed once the update kernels have read them (stream-ordered)
        self.held = []

    def _range_steps(self) -> dict[tuple[int, int], torch.Tensor | None]:
        """The step count of each range unlike the rest in this update: None where held (and its lag grows by
        this update, unless the update is skipped), else the updates applied less those it missed."""
        applied = (1 - self.overflow).to(self.applied.dtype)  # 0 when this update is skipped: nothing missed
        for r in self.held:
            self.lags[r] = self.lags[r] + applied if r in self.lags else applied.clone()
        held = set(self.held)
        return {r: None if r in held else self.applied - lag for r, lag in self.lags.items()}

    def live_gradient_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self._parts.values())


def _pieces(runs, steps: dict[tuple[int, int], torch.Tensor | None]) -> list[tuple]:
    """`runs` cut at the edges of the ranges in `steps`: (lo, hi, group) outside them, (lo, hi, group, step)
    inside one (step None: left alone)."""
    out: list[tuple] = []
    for lo, hi, g in runs:
        inside = sorted((max(a, lo), min(b, hi), step) for (a, b), step in steps.items() if a < hi and b > lo)
        at = lo
        for a, b, step in inside:
            if a > at:
                out.append((at, a, g))
            out.append((a, b, g, step))
            at = b
        if at < hi:
            out.append((at, hi, g))
    return out
