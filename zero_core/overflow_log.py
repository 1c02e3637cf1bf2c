"""Log skipped (non-finite) steps, and stop a run that keeps producing them, without stalling the device.

The skip counter and the run of consecutive non-finite steps live on the device. On CUDA each step
queues a non-blocking copy of them into pinned host memory behind an event; the next step reads the
copy only if the event has completed, so the log (and a stop) may trail by a step but the hot loop
never waits. A skipped step changes no weight, so stopping a step late loses nothing. On the CPU the
values are simply read.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("zero_core")


class NonFiniteError(FloatingPointError):
    """Too many consecutive optimizer steps had NaN/inf gradients (zero_core.max_consecutive_nonfinite)."""


class OverflowLog:
    def __init__(self, skipped: torch.Tensor, scaler: object, run: torch.Tensor, max_consecutive: int = 0) -> None:
        self.skipped = skipped
        self.scaler = scaler
        self.run = run  # consecutive non-finite steps up to the last one (device)
        self.max_consecutive = max_consecutive  # 0: never stop
        self.seen = 0
        self.cuda = skipped.is_cuda
        self.host = torch.zeros(3, dtype=torch.float32, pin_memory=self.cuda)
        self.event: torch.cuda.Event | None = None
        self.event_step = 0

    def _report(self, step: int, values: torch.Tensor) -> None:
        skipped, scale, run = int(values[0]), float(values[1]), int(values[2])
        if skipped > self.seen:
            log.warning(
                "step %d: non-finite gradients, update skipped (%d so far); loss scale now %g", step, skipped, scale
            )
            self.seen = skipped
        if self.max_consecutive and run >= self.max_consecutive:
            raise NonFiniteError(
                f"step {step}: gradients were NaN/inf for {run} consecutive steps, so training stopped "
                f"(zero_core.max_consecutive_nonfinite = {self.max_consecutive}; {skipped} of {step} steps skipped, "
                f"no weight changed by them; loss scale {scale:g}); lower the learning rate, check the data for bad "
                "values or use bf16 instead of fp16, then resume from the last checkpoint"
            )

    def poll(self, step: int) -> None:
        """Called once per optimizer step; raises NonFiniteError when the run of skipped steps reaches the limit."""
        current = torch.cat([self.skipped, self.scaler.scale, self.run])  # type: ignore[attr-defined]
        if not self.cuda:
            self._report(step, current)
            return
        if self.event is not None and self.event.query():
            self.event = None
            self._report(self.event_step, self.host)
        if self.event is None:
            self.host.copy_(current, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            self.event_step = step
