"""Stage 0: plain data parallelism. Every rank holds every weight, gradient and optimizer state.

Gradients accumulate in persistent flat buckets across micro-steps and are all-reduced once per
optimizer step, at the accumulation boundary; every rank then runs the same update over the whole
partition, writing the 16-bit weights straight into the working buffer.

As DeepSpeed's stage 0, whose torch optimizer steps the model's own fp32 parameters, an fp32 run takes weights the
script changed in place (`load_state_dict`, `clamp_` under no_grad, ...) as the masters the next update starts
from; 16-bit runs keep their fp32 masters as the truth, as DeepSpeed's mixed-precision optimizers do.

As DeepSpeed's stage 0, the rank-averaged gradient is left in each parameter's `.grad` after the backward
that ends an accumulation window (fp32 parameters: views of the optimizer's fp32 gradient, no copy), and
the step takes `.grad` as the script left it (clipped by `clip_grad_norm_`, say); `.grad` is None after it.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import comm
from .base import Stage


class ReplicatedStage(Stage):
    persistent_buckets = True
    reduces_every_micro_step = False
    _exposed: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (parameter, its gradient view) until the step
    _reduced = False  # this backward reduced the buckets (an accumulation boundary)
    _exposed_version = 0  # the gradient views' version counter when exposed: an in-place change moves it

    def attach(self, optimizer: Any, breakdown: Any) -> None:
        assert not optimizer.on_host, "the config refuses optimizer offload at stage 0"
        self.local = self.output = self.flat  # the layout has one shard: the whole buffer
        self.optimizer = optimizer

    def before_backward(self) -> None:
        self._release()  # a backward without a step in between: autograd must not add into the views
        self._reduced = False

    def on_group_reduced(self, g: int) -> None:
        self._reduced = True

    def after_backward(self) -> None:
        """Expose the reduced gradients as `.grad` (fp32 parameters only: `.grad` must have the parameter's dtype)."""
        if not self._reduced or not hasattr(self.optimizer, "gradient"):
            return
        exposed = []
        for s in self.layout.slots:
            p = self.params[s.index]
            if p.dtype != torch.float32:
                continue
            start = self.layout.groups[s.group].partition_offset + s.offset
            view = self.optimizer.gradient_of(start, start + s.numel)  # every bucket was reduced: a view
            p.grad = view.view(p.shape)
            exposed.append((p, p.grad))
        self._exposed = exposed
        self._exposed_version = exposed[0][1]._version if exposed else 0  # views share their base's counter

    def begin_update(self) -> None:
        """Take the exposed gradients as the script left them: replaced tensors are copied back, and where the
        script changed any (in place, or replaced), the norm and non-finite flag the step uses are recomputed;
        untouched, the reduction's own statistics stand."""
        touched = bool(self._exposed) and (self._exposed[0][1]._version != self._exposed_version
                                           or any(p.grad is not view for p, view in self._exposed))
        if touched:
            opt = self.optimizer
            with torch.no_grad():
                for p, view in self._exposed:
                    if p.grad is None:
                        view.zero_()
                    elif p.grad is not view:
                        view.copy_(p.grad.reshape(view.shape))
                grad = opt.gradient_of(0, opt.states.numel)
                opt.sumsq.copy_(grad.double().pow(2).sum().reshape(1))
                opt.nonfinite.copy_((~torch.isfinite(grad).all()).int().reshape(1))
        self.take_edited_weights()
        super().begin_update()

    def finish_update(self) -> None:
        self._release()
        super().finish_update()

    def take_edited_weights(self) -> None:
        """In fp32 the working weights hold the masters' values but for what the script wrote into them in place,
        through a parameter or its `.data` (which no version counter of ours sees): copying them is right either
        way, at one pass over the weights per update."""
        if self.dtype == torch.float32:
            with torch.no_grad():
                for lo, hi, views in self.optimizer.states.stream(("master",)):
                    views["master"].copy_(self.flat[lo:hi])

    def _release(self) -> None:
        for p, _ in self._exposed:
            p.grad = None
        self._exposed = []

    def reduce(self, bucket: torch.Tensor, group: Any) -> torch.Tensor:
        comm.all_reduce_sum(bucket, what=f"all-reduce of gradient bucket {group.index}")
        return bucket
