"""What every optimizer of a rank's partition does, wherever its states live.

The gradient reducer talks to an optimizer through three calls per reduction pass, and the engine
through `step`:

    opt.begin_pass(scale, accumulate, final)   # before a backward that reduces: statistics start afresh
    opt.receive(reduced, offset)               # each reduced gradient shard, on the reduce stream
    opt.end_pass()                             # after backward: every shard received is accounted for
    opt.step(out, publish, after_segment)      # clip, update, write the 16-bit weights into `out`

`step` is shared: one all-reduce makes the sum of squares and the non-finite flag global, and the
clip coefficient, the learning rate and the skip flag are computed as device tensors, so the hot loop
never waits on the host. Subclasses decide where the states live and how the update runs:
DeviceAdamW (device_adam.py: Triton kernels on the GPU) and HostAdamW (host_adam.py: host memory or
NVMe, torch's fused CPU Adam in chunks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch

from .. import comm
from ..loss_scaler import ReportsLossScale
from .clip_norm import clip_coefficient, norm_dtype
from .param_groups import Run

Publish = Callable[[int, int], None]
Output = torch.Tensor | list[torch.Tensor] | None


@dataclass
class Hyper:
    """One optimizer group's hyper-parameters besides the lr (which lives on the device, per group)."""

    beta1: float
    beta2: float
    eps: float
    weight_decay: float


class PartitionOptimizer(ReportsLossScale, ABC):
    """AdamW over this rank's contiguous fp32 partition (master, exp_avg, exp_avg_sq in `states`), with one
    set of hyper-parameters per optimizer group: `runs[i]` cuts segment i into (lo, hi, group) runs."""

    on_host: bool = False  # states and update on the host (the engine then uploads the 16-bit output)
    facade: torch.optim.Optimizer | None = None  # the optimizer initialize handed back (optim/facade.py)

    @property
    def param_groups(self) -> list[dict]:
        """The handed-back optimizer's groups, for scripts that read or set `engine.optimizer.param_groups`."""
        if self.facade is None:
            raise AttributeError("param_groups: this optimizer is not attached to an engine")
        return self.facade.param_groups

    def __init__(
        self,
        states,
        *,
        groups: list[Hyper],
        decoupled: bool,
        clip: float,
        lr_at: Callable[[torch.Tensor], torch.Tensor],
        shard_stats: bool,
        comm_device: torch.device,
        runs: list[list[Run]] | None = None,
        stage: int = 0,
    ) -> None:
        self.states = states
        self.comm_device = comm_device
        self.groups = groups
        self.runs = runs if runs is not None else [[(0, states.numel, 0)]]
        self.decoupled, self.clip = decoupled, clip
        self.lr_at = lr_at  # None: a host schedule writes `lr` before each step
        self.shard_stats = shard_stats  # False when every rank holds the whole gradient (stage 0)
        self.stage = stage  # the ZeRO stage whose DeepSpeed arithmetic the norm and the clip follow (clip_norm.py)
        dev = states.device
        self.sumsq = torch.zeros(1, dtype=torch.float64, device=dev)  # squares summed in fp64, as DeepSpeed's
        self.nonfinite = torch.zeros(1, dtype=torch.int32, device=dev)
        self.applied = torch.zeros(1, dtype=torch.float32, device=dev)  # updates actually applied
        self.skipped = torch.zeros(1, dtype=torch.float32, device=dev)
        self.lr = lr_at(self.applied)  # one per group
        self.grad_norm = torch.zeros(1, dtype=norm_dtype(stage), device=dev)
        self.overflow = torch.zeros(1, dtype=torch.int32, device=dev)
        self.scale: torch.Tensor | None = None  # this pass's multiplier of reduced sums (1 / (world * loss scale))
        self.accumulate = False  # this pass adds to gradients kept from earlier micro-steps

    # -- a reduction pass ----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """`engine.optimizer.zero_grad()`, as scripts call DeepSpeed's: nothing to do, the engine releases each
        gradient once it is reduced and starts every accumulation window afresh."""

    def begin_pass(self, scale: torch.Tensor, accumulate: bool, final: bool) -> None:
        """Before a backward that reduces; `final`: the step follows it. Only the last pass before a step
        counts for the norm and the overflow flag."""
        self.scale, self.accumulate = scale, accumulate
        self.sumsq.zero_()
        self.nonfinite.zero_()

    @abstractmethod
    def receive(self, reduced: torch.Tensor, offset: int) -> None:
        """Take a reduced gradient shard for partition elements [offset, offset + reduced.numel())."""

    def end_pass(self) -> None:
        """After backward: every received shard is folded in (a no-op where that happened on receipt)."""

    # -- the update ------------------------------------------------------------------------------------
    def _local_stats(self) -> torch.Tensor:
        """This rank's [sum of squares, non-finite flag] of the pass that ends at this step."""
        return torch.cat([self.sumsq, self.nonfinite.float()])

    def step(
        self, out: Output, publish: Publish | None = None, after_segment: Callable[[int], None] | None = None
    ) -> None:
        """Clip, update and write the working-precision copy into `out` (the partition, or one tensor per
        segment); skipped on a non-finite gradient. `publish(lo, hi)` (host updates) is called once
        out[lo:hi] holds its final values; `after_segment(i)` once segment i's update is queued."""
        stats = self._local_stats().to(norm_dtype(self.stage))  # stages 0-2 round this rank's sum to fp32 first
        if self.shard_stats:
            comm.all_reduce_sum_on(stats, self.comm_device, what="all-reduce of the gradient norm and overflow flag")
        stats = stats.to(self.sumsq.device)
        self.grad_norm = stats[:1].sqrt()
        # a sum of squares past the norm's range (finite gradients, inf in fp32) is an overflow too
        self.overflow = ((stats[1:] > 0) | ~torch.isfinite(self.grad_norm)).to(torch.int32)
        if self.clip > 0:
            coef = clip_coefficient(self.grad_norm, self.clip, self.stage)
        else:
            coef = torch.ones(1, dtype=torch.float32, device=self.grad_norm.device)
        if self.lr_at is not None:
            self.lr = self.lr_at(self.applied)
        ok = 1.0 - self.overflow.float()
        self.applied += ok
        self.skipped += 1.0 - ok
        self._update(coef, out, publish, after_segment)

    @abstractmethod
    def _update(
        self, coef: torch.Tensor, out: Output, publish: Publish | None, after_segment: Callable[[int], None] | None
    ) -> None: ...

    def bind_device_output(self, out: torch.Tensor | list[torch.Tensor]) -> None:
        """Host updates: where on the device a share updated there writes its 16-bit weights (partial offload)."""

    def run_host_update_with(self, launch: Callable[[Callable[[], None]], None]) -> bool:
        """Host updates: let `launch` run the chunked update (the stage's thread); False where it cannot."""
        return False

    def undo_speculation(self) -> None:
        """Host updates started during backward (speculative.py): put the states back as they were before the
        pass, so that they can be read or replaced between backward and step; the step then updates them all."""

    def gradient_of(self, lo: int, hi: int) -> torch.Tensor:
        """The fp32 gradient of partition elements [lo, hi) as the step will take it, before clipping (read between
        the backward that ends an accumulation window and step(), safe_get_full_grad)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no gradient to read")

    def device_state_numel(self) -> int:
        """Partition elements whose fp32 states live on the device (memory reports)."""
        return 0 if self.on_host else self.states.numel

    def live_gradient_bytes(self) -> int:
        """Bytes of fp32 gradients this optimizer holds now (memory reports)."""
        return 0

    def close(self) -> None:
        self.states.close()
