"""Gradient hooks and bucketed reduction into the fp32 gradient partition.

Stages 0-1 copy each gradient, as soon as autograd has accumulated it, into its group's persistent flat
buffer (they accumulate micro-steps there). Stages 2-3 keep the gradients autograd made until their group
has all of them, then copy them into a fresh flat buffer at once: a large bucket (DeepSpeed's default 5e8
elements) allocated whole as backward starts would sit on top of every activation (0.7 GiB at
DeBERTa-v2-xlarge on 2 ranks); the gradients instead grow layer by layer while backward frees activations.
When a group is complete and this pass reduces (every micro-step for stages 2-3, only at the accumulation
boundary for 0-1) it is reduced on the side stream while backward goes on, by the collective its stage
chooses (all-reduce at stage 0, reduce-scatter otherwise), and handed to the optimizer, which folds it into
its fp32 gradient wherever its states live (zero_core/optim/).

Inside an accumulation window stages 0-1 show each parameter's slice of its bucket as its `.grad` between
backwards (this rank's sum so far: DeepSpeed accumulates in `.grad` there), views set after the backward and
cleared before the next, never copies. Stage 0 under bf16 shows the boundary's reduced bucket so too, averaged
where it would be zeroed (DeepSpeed's `.grad`); the next window's first gradients are copied over it, not added.

Accumulation dtype (`data_types.grad_accum_dtype`, default the working precision, as DeepSpeed's). Stages 0-1
accumulate in their persistent buffers: in the communication dtype, or in fp32 when fp32 is asked for.
Stages 2-3 reduce every micro-step: with fp32 asked for, the optimizer folds each pass into its fp32
gradient; with 16 bits, the shards are summed in 16 bits until the boundary (grad_sums.py).

Every rank issues these collectives in one agreed order of the groups, whatever order its own groups complete
in: a rank whose forward skipped some parameters (a branch another rank took, an expert it routed nothing to)
completes different groups, or the same ones in another order, and pairing collectives by arrival would sum
one rank's bucket into another's. A group is reduced once it and every group before it in that order are
complete; the rest at the end of backward, the gradients that never arrived as zeros (the average DDP with
`find_unused_parameters` takes). The first reducing backward uses the reverse layout order (the order backward
completes groups in for models that register their modules in the order they call them), and rank 0's own
completion order in that backward becomes everyone's order from then on (one broadcast), so every later
backward reduces each group as soon as it is complete when all ranks use every parameter.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from checkpoints.layout import FlatLayout

from .. import comm
from ..optim import PartitionOptimizer
from .base import Stage
from .grad_sums import MicroStepSums


class GradReducer:
    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        layout: FlatLayout,
        optimizer: PartitionOptimizer,
        stage: Stage,
        *,
        comm_dtype: torch.dtype,
        side: comm.SideStream,
        device: torch.device,
    ) -> None:
        self.params = list(params)
        self.layout = layout
        self.opt = optimizer
        self.stage = stage  # the collective that reduces a bucket, and what happens once it is reduced
        self.side = side
        self.keep_buffers = stage.persistent_buckets  # stages 0-1 accumulate full gradients across micro-steps
        self.comm_dtype = comm_dtype  # the dtype buckets are reduced in
        accum = stage.cfg.grad_accum_dtype
        # stages 0-1 accumulate in their buckets: in fp32 only where fp32 is asked for under 16-bit training
        wider = self.keep_buffers and accum == torch.float32 and stage.cfg.dtype != torch.float32
        self.bucket_dtype = torch.float32 if wider else comm_dtype
        self.sums = None if self.keep_buffers or accum == torch.float32 else MicroStepSums(
            accum, optimizer.on_host, device)
        self._final = False  # this pass ends the window: the step follows
        self.device = device
        self.buffers: list[torch.Tensor | None] = [
            torch.zeros(g.padded_numel, dtype=self.bucket_dtype, device=device) if self.keep_buffers else None
            for g in layout.groups
        ]
        self.arrived = [0] * len(layout.groups)
        self.reduced = [False] * len(layout.groups)
        self._seen: set[int] = set()  # stages 2-3: parameters whose gradient reached the fresh buffer this pass
        # stages 2-3: gradients held until their group is complete (group -> [(slot, grad)])
        self._pending: dict[int, list] = {}
        # stages 2-3 take a fresh buffer each pass and copy each gradient in once: only the padding between
        # and after parameters needs zeros (not a memset of the whole bucket and an add over it)
        self._gaps: list[torch.Tensor | None] = [
            None if self.keep_buffers else _gap_index(g, device) for g in layout.groups
        ]
        self._window_grads: list[tuple[torch.nn.Parameter, torch.Tensor]] | None = None  # stages 0-1: .grad views
        self._showing = False  # those views are the parameters' .grad now
        # stage 0 under bf16, buckets reduced in place in the parameters' dtype: the boundary's average is shown
        self.keep_reduced = (getattr(stage, "shows_reduced_buckets", False) and stage.cfg.dtype == torch.bfloat16
                             and self.bucket_dtype == comm_dtype == torch.bfloat16)
        # per group: it holds the last window's average, not zeros; this pass's gradients copied over that
        self._stale, self._copied = [False] * len(layout.groups), [0] * len(layout.groups)
        self.reduce_now = False
        self.order = list(range(len(layout.groups) - 1, -1, -1))  # the order every rank reduces the groups in
        self._agreed = False  # the order was learned from rank 0's first reducing backward
        self._ready = [False] * len(layout.groups)  # complete in this pass
        self._next = 0  # position in `order` of the next group to reduce in this pass
        self._completed: list[int] = []  # groups in the order they completed in this pass
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self.params)]

    def begin(self, reduce_now: bool, accumulate: bool, scale: torch.Tensor, final: bool = True) -> None:
        """Called before each backward. `scale` multiplies reduced sums (1 / (world * loss scale));
        `accumulate`: reduced shards add to earlier micro-steps'; `final`: the optimizer step follows."""
        self._hide_window_grads()
        self.reduce_now = reduce_now
        self.arrived = [0] * len(self.layout.groups)
        self.reduced = [False] * len(self.layout.groups)
        self._ready = [False] * len(self.layout.groups)
        self._next = 0
        self._completed = []
        self._seen = set()
        self._copied = [0] * len(self.layout.groups)
        self._pending = {}
        self._final = final
        if self.sums is not None:
            if not accumulate:
                self.sums.restart()
            accumulate = False  # the optimizer sees only the boundary's sums
        if reduce_now and (final or self.sums is None):  # this pass hands reduced shards to the optimizer
            self.opt.begin_pass(scale, accumulate, final)

    def finish(self) -> None:
        """After backward: reduce groups some of whose parameters got no gradient, then join the side stream
        (after the first reducing backward, agree on the order of later ones)."""
        if self.reduce_now:
            for g in self.order[self._next :]:
                if not self.reduced[g]:
                    self._zero_missing(g)
                    self._reduce(g)
            self._next = len(self.order)
        self.opt.end_pass()
        self.side.join()
        if self.reduce_now and not self._agreed:
            self._agree_order()
        if self.keep_buffers and not self.reduce_now:
            for g in range(len(self.layout.groups)):
                self._zero_missing(g)  # (a reducing pass does it as it reduces each group)
        if self.keep_buffers and (self.keep_reduced or not self.reduce_now):
            self._show_window_grads()

    def _show_window_grads(self) -> None:
        """After a backward inside the window (stages 0-1; at stage 0 under bf16 also the boundary's): each
        parameter's `.grad` is its slice of the bucket, as DeepSpeed's `.grad` reads there (it accumulates in it).
        Where the bucket holds another dtype than the parameter (fp32 accumulation, another communication dtype)
        `.grad` stays None."""
        if self._window_grads is None:  # the buckets are persistent: their views are made once
            slots = self.layout.slots
            self._window_grads = [
                (p, self.buffers[slots[i].group][slots[i].offset : slots[i].offset + slots[i].numel].view(p.shape))
                for i, p in enumerate(self.params) if p.dtype == self.bucket_dtype]
        for p, view in self._window_grads:
            if p.requires_grad:
                p.grad = view
        self._showing = True

    def _hide_window_grads(self) -> None:
        """Before autograd runs: a `.grad` still set would take the next gradient in place (the hook adds it)."""
        if self._showing:
            for p, view in self._window_grads or ():
                if p.grad is not None and (p.requires_grad or p.grad is view):  # a frozen one's own is the script's
                    p.grad = None
            self._showing = False

    def _complete(self, g: int) -> None:
        """Group g has all its gradients: reduce it, and the groups after it in the order that waited for it."""
        self._ready[g] = True
        self._completed.append(g)
        order = self.order
        while self._next < len(order) and self._ready[order[self._next]]:
            self._reduce(order[self._next])
            self._next += 1

    def _agree_order(self) -> None:
        """Rank 0's completion order of this backward (the groups it did not complete after it) becomes every
        rank's reduction order."""
        done = set(self._completed)
        seq = self._completed + [g for g in self.order if g not in done]
        agreed = torch.tensor(seq, dtype=torch.int64, device=self.device)
        comm.broadcast_(agreed, what="broadcast of the gradient buckets' reduction order")
        self.order = [int(g) for g in agreed.tolist()]
        self._agreed = True

    def _buffer(self, g: int) -> torch.Tensor:
        buf = self.buffers[g]
        if buf is None:
            gaps = self._gaps[g]
            numel = self.layout.groups[g].padded_numel
            if gaps is None:
                buf = torch.zeros(numel, dtype=self.bucket_dtype, device=self.device)
            else:
                buf = self._uninitialised(numel)
                if gaps.numel():
                    buf.index_fill_(0, gaps, 0)
            self.buffers[g] = buf
        return buf

    def _uninitialised(self, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=self.bucket_dtype, device=self.device)

    def _assemble(self, g: int) -> torch.Tensor:
        """The group's flat buffer, with the gradients held for it (stages 2-3) copied in and released."""
        buf = self._buffer(g)
        firsts: tuple[list, list] = ([], [])
        again = []
        for slot, grad in self._pending.pop(g, ()):
            view = buf[slot.offset : slot.offset + slot.numel].view_as(grad)
            if slot.index in self._seen:
                again.append((view, grad))  # the parameter's hook fired twice in this pass: the gradients add
            else:
                firsts[0].append(view)  # the first arrival in a fresh buffer: no zeroing pass, no read of it
                firsts[1].append(grad)
                self._seen.add(slot.index)
        if firsts[0]:
            torch._foreach_copy_(*firsts)  # one launch for the unit's gradients, not one per parameter
        for view, grad in again:
            view.add_(grad)
        return buf

    def _zero_missing(self, g: int) -> None:
        """Zero the slots of parameters that got no gradient in this pass where the bucket holds something else:
        uninitialised memory (stages 2-3), the last window's average (stage 0 under bf16)."""
        if self.keep_buffers:
            stale, self._stale[g] = self._stale[g], False
            if not stale or self._copied[g] == len(self.layout.groups[g].slots):
                return
        buf = self._assemble(g)
        for s in self.layout.groups[g].slots:
            if s.index not in self._seen:
                buf[s.offset : s.offset + s.numel].zero_()

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        slot = self.layout.slots[index]

        def hook(p: torch.Tensor) -> None:
            grad = p.grad
            if grad is None:
                return
            if self.keep_buffers:  # stages 0-1 accumulate micro-steps in the persistent buffer
                view = self._buffer(slot.group)[slot.offset : slot.offset + slot.numel].view_as(grad)
                if self._stale[slot.group] and slot.index not in self._seen:  # over the last window's average
                    view.copy_(grad)
                    self._seen.add(slot.index)
                    self._copied[slot.group] += 1
                else:
                    view.add_(grad)
            else:  # held until the group is complete (_assemble)
                self._pending.setdefault(slot.group, []).append((slot, grad))
            p.grad = None
            self.arrived[slot.group] += 1
            if self.reduce_now and self.arrived[slot.group] == len(self.layout.groups[slot.group].slots):
                self._complete(slot.group)

        return hook

    def _reduce(self, g: int) -> None:
        group = self.layout.groups[g]
        if self.keep_buffers:
            self._zero_missing(g)
        buf = self._assemble(g)  # stages 0-1 hold nothing pending: their persistent buffer as it is
        with self.side.after_current():
            # an fp32-accumulated bucket is reduced in the communication dtype, as DeepSpeed reduces its sums
            reduced = self.stage.reduce(buf if buf.dtype == self.comm_dtype else buf.to(self.comm_dtype), group)
            if self.sums is not None:
                reduced = self.sums.add(g, reduced, self._final)
            if reduced is not None:
                self.opt.receive(reduced, group.partition_offset)
            if self.keep_reduced:  # averaged in place, as DeepSpeed's `.grad`; the next window writes over it
                assert reduced is buf, "stage 0 reduces its bucket in place"
                if comm.world_size() > 1:
                    buf.mul_(1.0 / comm.world_size())
                self._stale[g] = True
            elif self.keep_buffers:
                buf.zero_()
            else:
                self.side.keep_alive(buf)
                self.buffers[g] = None
        self.reduced[g] = True
        self.stage.on_group_reduced(g)

    def remove(self) -> None:
        """Detach the hooks from the parameters."""
        self._hide_window_grads()
        for h in self._handles:
            h.remove()


def _gap_index(group, device: torch.device) -> torch.Tensor:
    """Positions of a group's flat buffer that no parameter covers (alignment gaps and the tail)."""
    ranges, end = [], 0
    for s in sorted(group.slots, key=lambda s: s.offset):
        if s.offset > end:
            ranges.append(torch.arange(end, s.offset))
        end = max(end, s.offset + s.numel)
    if group.padded_numel > end:
        ranges.append(torch.arange(end, group.padded_numel))
    return (torch.cat(ranges) if ranges else torch.empty(0, dtype=torch.long)).to(device)
