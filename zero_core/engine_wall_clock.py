"""`wall_clock_breakdown: true`: DeepSpeed's timing lines, with the times of zero_core's own phases, printed by
rank 0 (as DeepSpeed's engine prints them, through `engine.timers`, engine_timers.py):

    at every step():       [Rank 0] time (ms) | fwd_microstep: .. | bwd_microstep: .. | bwd_inner_microstep: .. |
                           bwd_allreduce_microstep: .. | step_microstep: ..
    at an update, before:  [Rank 0] time (ms) | optimizer_allgather: .. | optimizer_step: ..   (stages 1-2)
                           [Rank 0] time (ms) | optimizer_step: ..                            (stage 3)
    at an update, after:   [Rank 0] time (ms) | fwd: .. | bwd: .. | bwd_inner: .. | bwd_allreduce: .. | step: ..

The micro-step line covers the forwards, backward and step since the last step(); the update's last line sums
the accumulation window. The phases: fwd the model's forward; bwd the whole engine.backward, of which bwd_inner
is autograd (gradients are reduced during it, bucket by bucket, as they are ready) and bwd_allreduce the rest
(the last buckets' reduction and the end of the pass); step the whole engine.step. optimizer_step is the
update (gradient norm and overflow check, clipping, Adam, the working-precision copy); optimizer_allgather at
stages 1-2 sends the updated weights to every rank and ends with the step (at stage 3 modules gather them when
they run, and the update's hand-over is counted in optimizer_step). DeepSpeed's optimizer_gradients, a separate
pass over the gradients before its update, has no counterpart: zero_core does that work inside optimizer_step.
A phase that never ran yet (a step before any forward) is left out, as DeepSpeed leaves out timers never started.
With a monitor on, each update's window sums also go to it as DeepSpeed's `Train/Samples/elapsed_time_ms_*` events
(engine_monitor.py). An enabled `flops_profiler` section turns all this on too, as DeepSpeed's config does.
"""

from __future__ import annotations

import weakref
from typing import Any, TypeVar

from .engine_monitor import write_phase_events

PHASES = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
MICRO = tuple(f"{p}_microstep" for p in PHASES)
T = TypeVar("T")


def wall_clock(engine: Any) -> WallClockBreakdown:
    """The engine's phase timers, made at the first call (after the engine's config is set)."""
    clock = engine.__dict__.get("_wall_clock")
    if clock is None:
        clock = engine.__dict__["_wall_clock"] = WallClockBreakdown(engine)
    return clock


class WallClockBreakdown:
    """The engine's phase timers; every call does nothing when the config's wall_clock_breakdown is off."""

    def __init__(self, engine: Any) -> None:
        self.on = engine.wall_clock_breakdown()
        self.timers = engine.timers if self.on else None
        self.stage = engine.stage
        self.engine = weakref.ref(engine)  # for its monitor; the engine holds this object

    def _start(self, *phases: str) -> None:
        for phase in phases:
            for name in (phase, f"{phase}_microstep"):
                timer = self.timers(name)
                timer.started_at = None  # a span a raised exception left open is dropped, not counted
                timer.start()

    def _stop(self, *phases: str) -> None:
        for phase in phases:
            for name in (phase, f"{phase}_microstep"):
                timer = self.timers(name)
                if timer.started:
                    timer.stop()

    # -- forward and backward ------------------------------------------------------------------------------------
    def forward(self, module: Any, *args: Any, **kwargs: Any) -> Any:
        """module(*args, **kwargs), timed."""
        if not self.on:
            return module(*args, **kwargs)
        self._start("fwd")
        try:
            return module(*args, **kwargs)
        finally:
            self._stop("fwd")

    def backward_started(self) -> None:
        if self.on:
            self._start("bwd")

    def autograd_started(self) -> None:
        if self.on:
            self._start("bwd_inner")

    def autograd_done(self) -> None:
        if self.on:
            self._stop("bwd_inner")
            self._start("bwd_allreduce")

    def backward_done(self, loss: T) -> T:
        """The end of engine.backward, which returns `loss`."""
        if self.on:
            self._stop("bwd_allreduce", "bwd")
        return loss

    # -- step ----------------------------------------------------------------------------------------------------
    def step_started(self, boundary: bool) -> None:
        """The start of engine.step; at a boundary the update starts there too (its lrs are set first)."""
        if self.on:
            self._start("step")
            if boundary:
                self.timers("optimizer_step").started_at = None
                self.timers("optimizer_step").start()

    def gather_started(self) -> None:
        """The update is written; the stage sends the new weights (stages 1-2: the all-gather)."""
        if self.on and self.stage in (1, 2):
            self.timers("optimizer_step").stop()
            self.timers("optimizer_allgather").started_at = None
            self.timers("optimizer_allgather").start()

    def step_done(self, boundary: bool) -> None:
        """The end of engine.step (the update's end too): print the lines (rank 0), as DeepSpeed's step does."""
        if not self.on:
            return
        for name in ("optimizer_allgather", "optimizer_step"):
            timer = self.timers.timers.get(name)  # not made here: stage 3 prints no optimizer_allgather
            if timer is not None and timer.started:
                timer.stop()
        self._stop("step")
        if boundary and self.stage > 0:
            self.timers.log(["optimizer_allgather", "optimizer_step"])
        self.timers.log(MICRO)
        if boundary:  # the window's sums, to the monitor and then printed (which resets them), as DeepSpeed's
            timers = self.timers.timers
            write_phase_events(self.engine(), {p: timers[p].elapsed(reset=False) for p in PHASES if p in timers})
            self.timers.log(PHASES)
