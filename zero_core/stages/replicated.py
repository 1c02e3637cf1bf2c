"""Stage 0: plain data parallelism. Every rank holds every weight, gradient and optimizer state.

Gradients accumulate in persistent flat buckets across micro-steps and are all-reduced once per
optimizer step, at the accumulation boundary; every rank then runs the same update over the whole
partition, writing the 16-bit weights straight into the working buffer.

As DeepSpeed's stage 0, whose torch optimizer steps the model's own fp32 parameters, an fp32 run takes weights the
script changed in place (`load_state_dict`, `clamp_` under no_grad, ...) as the masters the next update starts
from; 16-bit runs keep their fp32 masters as the truth, as DeepSpeed's mixed-precision optimizers do.

As DeepSpeed's stage 0, the rank-averaged gradient is left in each parameter's `.grad` after the backward
that ends an accumulation window (fp32: views of the optimizer's fp32 gradient; bf16: views of the reduced buckets,
grad_buckets.py; no copy either way), and the step takes `.grad` as the script left it (clipped by
`clip_grad_norm_`, say); `.grad` is None after it. In fp32, as there, a parameter whose `.grad` is None at the step
(frozen after `initialize`, or set to None by the script) is not stepped at all: no weight decay, no moment update,
no step count (its own torch AdamW state there); under bf16 DeepSpeed's optimizer takes zeros for it, and so does
this one.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import comm
from .base import Stage


class ReplicatedStage(Stage):
    persistent_buckets = True
    reduces_every_micro_step = False
    shows_reduced_buckets = True  # under bf16 the reducer leaves the boundary's average in its buckets, as `.grad`
    # (parameter, its gradient view, where that starts in the partition) until the step
    _exposed: list[tuple[torch.nn.Parameter, torch.Tensor, int]] = []
    _reduced = False  # this backward reduced the buckets (an accumulation boundary)
    # one view per bucket and its version counter when exposed: an in-place change of any view moves its bucket's
    _versions: list[tuple[torch.Tensor, int]] = []
    _frozen: list[tuple[int, int]] = []  # partition ranges of fp32 parameters frozen at this boundary's backward
    _slots: list[tuple[torch.nn.Parameter, int, int, int]] = []

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
        """Expose the reduced gradients as `.grad` in the parameters' dtype: fp32 ones here; 16-bit ones where the
        reducer showed its buckets (bf16), which are taken as they are."""
        if not self._reduced or not hasattr(self.optimizer, "gradient"):
            return
        if not self._slots:  # (parameter, its partition range, its bucket), made once
            self._slots = [(self.params[s.index], self.layout.groups[s.group].partition_offset + s.offset, s.numel,
                            s.group) for s in self.layout.slots]
        exposed, frozen, bases = [], [], {}
        fp32 = self.dtype == torch.float32
        for p, start, numel, g in self._slots:
            if not p.requires_grad:  # frozen after initialize: DeepSpeed leaves its `.grad` None
                if fp32:  # and its torch AdamW skips it
                    frozen.append((start, start + numel))
                continue
            if fp32:
                p.grad = self.optimizer.gradient_of(start, start + numel).view(p.shape)  # a view: all were reduced
            elif p.grad is None:  # no bucket of the parameter's dtype to show
                continue
            exposed.append((p, p.grad, start))
            bases.setdefault(g, p.grad)
        self._exposed, self._frozen = exposed, frozen
        self._versions = [(view, view._version) for view in bases.values()]  # views share their bucket's counter

    def begin_update(self) -> None:
        """Take the exposed gradients as the script left them: replaced tensors are copied back (16-bit ones into
        the fp32 gradient too), and where the script changed any (in place, or replaced), the norm and non-finite
        flag the step uses are recomputed; untouched, the reduction's own statistics stand."""
        touched = (any(view._version != version for view, version in self._versions)
                   or any(p.grad is not view for p, view, _ in self._exposed))
        held = list(self._frozen)  # ranges the update leaves alone, as torch's AdamW a parameter without `.grad`
        if touched:
            opt = self.optimizer
            with torch.no_grad():
                for p, view, start in self._exposed:
                    if p.grad is None:
                        view.zero_()  # out of the norm, as DeepSpeed's clipping leaves it out
                        if view.dtype == torch.float32:
                            held.append((start, start + view.numel()))
                    elif p.grad is not view:
                        view.copy_(p.grad.reshape(view.shape))
                    if view.dtype != torch.float32:
                        opt.gradient_of(start, start + view.numel()).copy_(view.reshape(-1))
                grad = opt.gradient_of(0, opt.states.numel)
                opt.sumsq.copy_(grad.double().pow(2).sum().reshape(1))
                opt.nonfinite.copy_((~torch.isfinite(grad).all()).int().reshape(1))
        self.optimizer.held = held
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
        for p, _, _ in self._exposed:
            p.grad = None
        self._exposed, self._frozen, self._versions = [], [], []

    def reduce(self, bucket: torch.Tensor, group: Any) -> torch.Tensor:
        comm.all_reduce_sum(bucket, what=f"all-reduce of gradient bucket {group.index}")
        return bucket
