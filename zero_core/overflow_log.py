"""Log skipped (overflow) steps without stalling the device.

The skip counter lives on the device. On CUDA each step queues a non-blocking copy of it into pinned
host memory behind an event; the next step reads the copy only if the event has completed, so the
log may trail by a step but the hot loop never waits. On the CPU the value is simply read.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("zero_core")


class OverflowLog:
    def __init__(self, skipped: torch.Tensor, scaler: object) -> None:
        self.skipped = skipped
        self.scaler = scaler
        self.seen = 0
        self.cuda = skipped.is_cuda
        self.host = torch.zeros(2, dtype=torch.float32, pin_memory=self.cuda)
        self.event: torch.cuda.Event | None = None
        self.event_step = 0

    def _report(self, step: int, values: torch.Tensor) -> None:
        skipped, scale = int(values[0]), float(values[1])
        if skipped > self.seen:
            log.warning("step %d: non-finite gradients, update skipped (%d so far); loss scale now %g", step, skipped, scale)
            self.seen = skipped

    def poll(self, step: int) -> None:
        """Called once per optimizer step."""
        current = torch.cat([self.skipped, self.scaler.scale])  # type: ignore[attr-defined]
        if not self.cuda:
            self._report(step, current)
            return
        if self.event is not None and self.event.query():
            self._report(self.event_step, self.host)
            self.event = None
        if self.event is None:
            self.host.copy_(current, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            self.event_step = step
