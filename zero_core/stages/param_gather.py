"""Stage 3: parameters live sharded; each module's parameters are gathered just before it runs.

Every module that owns trainable parameters is a *unit* (one layout group). Its parameters are
views of one flat working-precision buffer whose storage is resized to zero when released, so the
views (and autograd's saved references to them) stay valid across a release/re-gather cycle.
Forward: gather in a pre-hook, release in a post-hook, and prefetch the next units in the order
recorded on the first step. Backward: a pass-through autograd node on the module's outputs
re-gathers the unit before its gradients are computed; the gradient reducer releases it once its
gradients are reduced. Units under the persistence threshold are never released, and a unit whose backward
comes soon after its forward (stage3_max_reuse_distance) is kept between the two. A released unit's parameters
are gathered when a forward (of the model or of any module in it, called on its own) or a backward reads them
outside the unit's own forward, and refuse reads elsewhere (released_params.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .. import comm
from checkpoints.layout import FlatLayout

from .released_params import ReleasedReads


class _PreBackward(torch.autograd.Function):
    """Identity whose backward gathers the owning units before the module's own backward runs."""

    @staticmethod
    def forward(ctx: Any, gatherer: "ParamGatherer", units: tuple[int, ...], t: torch.Tensor) -> torch.Tensor:
        ctx.gatherer, ctx.units = gatherer, units
        return t.detach()  # not a view: callers may modify the output in place (Trainer's `loss *= world`)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.gatherer.gather_for_backward(ctx.units)
        return None, None, grad


def _map_tensors(obj: Any, fn: Any) -> Any:
    """Apply fn to every tensor in a nested output (tensor, tuple, list, dict or dataclass-like)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(o, fn) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        for k in list(obj.keys()):
            obj[k] = _map_tensors(obj[k], fn)
        return obj
    if hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for k, v in list(vars(obj).items()):
            if isinstance(v, (torch.Tensor, tuple, list, dict)):
                setattr(obj, k, _map_tensors(v, fn))
    return obj


class ParamGatherer:
    def __init__(
        self,
        units: Sequence[tuple[torch.nn.Module, tuple[int, ...]]],
        layout: FlatLayout,
        full: Sequence[torch.Tensor],
        shard_of: Callable[[int, int], torch.Tensor],
        *,
        persistence_threshold: int,
        prefetch_numel: int,
        max_live_numel: int,
        side: comm.SideStream,
        max_reuse_numel: int = 0,
        params: Sequence[torch.nn.Parameter] = (),
        root: torch.nn.Module | None = None,
    ) -> None:
        self.layout = layout
        self.full = list(full)  # per-group full buffers; parameters are views of these
        self.shard_of = shard_of  # (lo, hi) -> this rank's working-precision partition elements [lo, hi)
        self.persistent = [g.numel < persistence_threshold for g in layout.groups]
        self.prefetch_numel, self.max_live_numel = prefetch_numel, max_live_numel
        self.max_reuse_numel = max_reuse_numel
        self.kept_for_reuse = [False] * len(self.full)  # kept after forward: backward reads it again soon
        self._reuse_numel: list[int] | None = None  # per unit: elements gathered between its forward and backward
        self.side = side
        self.refs = [0] * len(self.full)
        self.held_for_backward = [False] * len(self.full)
        self.fresh = [False] * len(self.full)  # gathered since the last optimizer step
        self.pending: dict[int, torch.cuda.Event] = {}
        self.live_numel = sum(g.padded_numel for g in layout.groups if self._is_allocated(g.index))  # freed below
        self.order: list[int] = []  # forward order of units, recorded on the first step
        self.recording = True
        self.ready: Callable[[int], bool] = lambda g: True  # unit g's shard holds this step's weights (no wait)
        self.wait_for: Callable[[int], None] = lambda g: None  # block until it does (an overlapped host update)
        self._handles = []
        for module, needed in units:
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(needed)))
            self._handles.append(module.register_forward_hook(self._post_hook(needed)))
        owned = [[params[s.index] for s in grp.slots] if params else [] for grp in layout.groups]
        # every module's forward counts as the model's: a script may call any submodule on its own (generate()
        # calls the encoder; a loss calls the body, then the head), and what it reads is gathered as it reads it
        self.reads = ReleasedReads(owned, [[s.name for s in grp.slots] for grp in layout.groups],
                                   ([root] if root is not None else []) + [m for m, _ in units],
                                   self.borrow, self.settle, alone=comm.world_size() == 1,
                                   model_modules=list(root.modules()) if root is not None else [])
        for g in range(len(self.full)):
            self._free(g)

    # -- storage ----------------------------------------------------------------------------------
    def _nbytes(self, g: int) -> int:
        return self.layout.groups[g].padded_numel * self.full[g].element_size()

    def _free(self, g: int) -> None:
        if self._is_allocated(g):
            self.full[g].untyped_storage().resize_(0)
            self.live_numel -= self.layout.groups[g].padded_numel
        self.fresh[g] = False
        self.reads.mark_released(g)  # its parameters' elements are gone: reading one gathers or refuses

    def _is_allocated(self, g: int) -> bool:
        return self.full[g].untyped_storage().size() > 0

    def _issue_gather(self, g: int, asynchronous: bool) -> None:
        """Allocate (on the compute stream) and all-gather unit g, on the side stream if asynchronous."""
        if not self._is_allocated(g):
            self.full[g].untyped_storage().resize_(self._nbytes(g))
            self.live_numel += self.layout.groups[g].padded_numel
        group = self.layout.groups[g]
        lo, hi = group.partition_offset, group.partition_offset + group.shard_numel
        if asynchronous and self.side.stream is not None:
            with self.side.after_current():
                # the shard (a cast of the master, or an offloaded shard brought up) is made on the side
                # stream: made on the compute stream, its memory could be reused there mid-gather
                self._gather_into(g, lo, hi)
                ev = torch.cuda.Event()
                ev.record()
            self.pending[g] = ev
        else:
            self._gather_into(g, lo, hi)
        self.fresh[g] = True

    def _gather_into(self, g: int, lo: int, hi: int) -> None:
        """Unit g's full weights from every rank's shard [lo, hi); one rank copies its shard straight in (from
        host memory too: no staging copy on the device)."""
        shard = self.shard_of(lo, hi)
        if comm.world_size() == 1:
            self.full[g].data.copy_(shard, non_blocking=True)
            return
        comm.all_gather_flat(self.full[g], shard.to(self.full[g].device, non_blocking=True),
                             what=f"all-gather of stage-3 unit {g}")

    def _ensure(self, g: int) -> None:
        if not self.fresh[g] and g not in self.pending:
            self._issue_gather(g, asynchronous=False)
        ev = self.pending.pop(g, None)
        if ev is not None:
            torch.cuda.current_stream().wait_event(ev)
        self.reads.mark_gathered(g)

    def _release(self, g: int) -> None:
        if (self.refs[g] == 0 and not self.held_for_backward[g] and not self.kept_for_reuse[g]
                and not self.reads.borrowed[g] and not self.persistent[g] and g not in self.pending):
            self._free(g)

    def _keep_for_backward(self, g: int) -> bool:
        """DeepSpeed's stage3_max_reuse_distance: after its forward, a unit whose backward comes within that many
        gathered elements (those of the units after it, gathered for their forward and again for their backward)
        stays gathered, within stage3_max_live_parameters; the first step, which records the order, keeps none."""
        if self.recording or self.max_reuse_numel <= 0:
            return False
        if self._reuse_numel is None:  # a unit outside the recorded order is never kept
            self._reuse_numel = [self.max_reuse_numel] * len(self.full)
            after = 0
            for u in reversed(self.order):
                self._reuse_numel[u] = 2 * after
                after += self.layout.groups[u].padded_numel
        return self._reuse_numel[g] < self.max_reuse_numel and self.live_numel <= self.max_live_numel

    def _prefetch(self, after: int, backward: bool) -> None:
        """Start gathering the units that run after unit `after`, up to the prefetch budget."""
        if self.side.stream is None or self.recording or after not in self.order:
            return
        seq = self.order[::-1] if backward else self.order
        pos = seq.index(after)
        budget = self.prefetch_numel
        for g in seq[pos + 1 :]:
            size = self.layout.groups[g].padded_numel
            if budget <= 0 or self.live_numel + size > self.max_live_numel:
                break
            if not self.fresh[g] and g not in self.pending:
                if not self.ready(g):  # the host update has not published it yet: its own forward waits
                    break
                self._issue_gather(g, asynchronous=True)
            budget -= size

    # -- hooks ------------------------------------------------------------------------------------
    def _pre_hook(self, needed: tuple[int, ...]) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            for g in needed:
                self._ensure(g)
                self.refs[g] += 1
                if self.recording and g not in self.order:
                    self.order.append(g)
            self._prefetch(needed[0], backward=False)

        return hook

    def _post_hook(self, needed: tuple[int, ...]) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            grad = torch.is_grad_enabled()  # no backward follows an evaluation forward
            for g in needed:
                self.refs[g] -= 1
                self.kept_for_reuse[g] = grad and self._keep_for_backward(g)
                self._release(g)
            if not grad:
                return output
            wrap = lambda t: _PreBackward.apply(self, needed, t) if t.requires_grad else t  # noqa: E731
            return _map_tensors(output, wrap)

        return hook

    def gather_for_backward(self, units: tuple[int, ...]) -> None:
        for g in units:
            self._ensure(g)
            self.held_for_backward[g] = True
            self.kept_for_reuse[g] = False
        self._prefetch(units[0], backward=True)

    def on_group_reduced(self, g: int) -> None:
        """Gradients of unit g are reduced: its full parameters are no longer needed."""
        self.held_for_backward[g] = False
        self.kept_for_reuse[g] = False
        self._release(g)

    def end_backward(self) -> None:
        """Release units held by a backward whose gradients never arrived (e.g. unused outputs), and those a
        forward or backward read outside their own forward."""
        for g in range(len(self.full)):
            self.held_for_backward[g] = self.kept_for_reuse[g] = False
            self.reads.borrowed[g] = self.reads.until_backward[g] = False
            self._release(g)

    def borrow(self, g: int) -> None:
        """A forward or backward reads unit g's parameters outside the unit's own forward: gather it and keep it
        until the backward ends (autograd may have saved them), or until a forward without grad returns. (On one
        rank, also a read anywhere of a kept unit whose overlapped update was still running.)"""
        self.wait_for(g)  # its module's forward may not have waited for the update yet
        self._ensure(g)
        self.reads.borrowed[g] = True

    def settle(self) -> None:
        """A forward without grad returned: the units it borrowed go back (not those a forward with grad borrowed
        before it: its backward reads them)."""
        for g in range(len(self.full)):
            if self.reads.borrowed[g] and not self.reads.until_backward[g]:
                self.reads.borrowed[g] = False
                self._release(g)

    def after_step(self, update_in_flight: bool) -> None:
        """The optimizer rewrote the local shards: every gathered copy is stale. Units kept whole are gathered
        again now, on every rank (all run the step), so a read before the next forward sees the new weights, as
        DeepSpeed's persistent parameters do; while the host update still runs (`update_in_flight`), they are
        marked stale instead: their next forward gathers them, and a read elsewhere waits or is refused
        (released_params.py)."""
        self.recording = False
        for ev in self.pending.values():
            torch.cuda.current_stream().wait_event(ev)
        self.pending.clear()
        for g in range(len(self.full)):
            self.fresh[g] = self.kept_for_reuse[g] = self.reads.borrowed[g] = self.reads.until_backward[g] = False
            if not self.persistent[g]:
                self._free(g)
            elif update_in_flight:
                self.reads.mark_stale(g)
            else:
                self._ensure(g)

    def gather_all(self) -> None:
        """Materialise every unit (for evaluation helpers that bypass module hooks)."""
        for g in range(len(self.full)):
            self._ensure(g)

    def hold(self, groups: list[int]) -> None:
        """Gather `groups` (current weights) and keep them until `let_go` (GatheredParameters)."""
        for g in groups:
            self._ensure(g)
            self.refs[g] += 1

    def let_go(self, groups: list[int]) -> None:
        for g in groups:
            self.refs[g] -= 1
            self._release(g)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self.reads.remove()
