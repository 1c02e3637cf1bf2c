"""Where an offloaded step's time goes: host wall-clock timers around the host phases, CUDA events
around the device phases, averaged per optimizer step.

    engine.breakdown.reset()            # e.g. after warm-up
    ... train ...
    engine.breakdown.summary()          # {"step": 612.0, "gpu_fwd_bwd": 171.3, ...} in ms per step

Keys (ms per optimizer step; "overlapped" phases run while something else does):
  step         host wall-clock from one step's end to the next (the first from its first forward)
  gpu_fwd_bwd  device time of forward + backward on the compute stream (every micro-step; host time on a CPU run)
  d2h          device time of the reduced-gradient copies to the host (side stream; overlapped with backward)
  host_fold    host time folding those shards into the fp32 gradient/statistics (its own thread; overlapped)
  fold_wait    host time the end of backward waited for the last shards to land (and be folded); it
               overlaps the GPU's tail of backward, so only what passes that is exposed
  cpu_adam     host time of the chunked update: AdamW, 16-bit conversion, issuing the copies (exposed)
  gpu_adam     device time of the fused update of the share kept on the device (partial offload; it runs
               while the host updates its share)
  overlapped_cpu_adam  host time of updates run off the training thread: during backward (speculative), or
               after step() returns (zero_core.overlap_weight_gather), overlapping the next forward
  streamed_adam  host wall-clock of the streamed share's update on the GPU, from queuing it to its last copy
               back (zero_core.offload_stream_fraction; it runs beside the host's own, inside that update)
  stream_wait  host time that update waited for the streamed chunks after finishing its own (the streamed
               fraction is too large if it is long; too small if it is zero and streamed adam ends early)
  update_wait  host time the training thread waited for that update: the next forward's modules for their
               weights, then backward (or a reader) for the rest (inside gpu_fwd_bwd: idle device time)
  nvme_wait    the part of cpu_adam spent waiting for NVMe reads and writes
  h2d          device time of the 16-bit weight copies to the GPU (overlapped with cpu_adam)
  h2d_tail     from the end of cpu_adam until the last copy landed (exposed)
  exposed      step - gpu_fwd_bwd - cpu_adam: what is not hidden (fold wait past backward, the norm
               all-reduce, the H2D tail, the weight all-gather, launch gaps)
Costs: a few perf_counter calls and two CUDA events per copied bucket/chunk; on by default with
optimizer offload (`ZERO_CORE_BREAKDOWN=0` turns it off, `=1` turns it on for any run). `summary()`
waits for the events it reads (a host sync); nothing else ever does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .env_switch import env_switch

KEYS = (
    "step",
    "gpu_fwd_bwd",
    "d2h",
    "host_fold",
    "fold_wait",
    "cpu_adam",
    "gpu_adam",
    "overlapped_cpu_adam",
    "streamed_adam",
    "stream_wait",
    "update_wait",
    "nvme_wait",
    "h2d",
    "h2d_tail",
    "exposed",
)
_Span = tuple[str, "torch.cuda.Event", "torch.cuda.Event"]


def enabled_for(offload: bool) -> bool:
    switch = env_switch("ZERO_CORE_BREAKDOWN")
    if switch is False:
        return False
    return offload or switch is True


class StepBreakdown:
    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self._lock = threading.Lock()
        self._host: dict[str, float] = {}
        self._spans: list[_Span] = []
        self._pending: list[tuple[dict[str, float], list[_Span]]] = []  # steps whose events may still run
        self._totals = dict.fromkeys(KEYS, 0.0)
        self._steps = 0
        self._clock: float | None = None
        self._compute: torch.cuda.Event | float | None = None

    # -- recording ---------------------------------------------------------------------------------
    def add(self, key: str, seconds: float) -> None:
        """Add host time to this step's `key` (thread-safe: the fold thread reports here)."""
        if self.enabled:
            with self._lock:
                self._host[key] = self._host.get(key, 0.0) + seconds

    @contextmanager
    def host(self, key: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(key, time.perf_counter() - start)

    @contextmanager
    def device(self, key: str) -> Iterator[None]:
        """Device time of the work queued inside (CUDA events on the current stream), host time on the CPU."""
        if not self.cuda:
            with self.host(key):
                yield
            return
        start = self.event()
        try:
            yield
        finally:
            self.span(key, start, self.event())

    def event(self, stream: torch.cuda.Stream | None = None) -> torch.cuda.Event | None:
        """A timing event recorded now on `stream` (default: the current one); None off CUDA."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def span(self, key: str, start: torch.cuda.Event | None, end: torch.cuda.Event | None) -> None:
        if start is not None and end is not None:
            self._spans.append((key, start, end))

    def forward_started(self) -> None:
        """A forward begins: starts the step clock (first micro-step) and the compute span."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._clock is None:
            self._clock = now
        self._compute = self.event() if self.cuda else now

    def backward_done(self) -> None:
        """Backward's autograd pass is queued (CUDA) or done (CPU): closes the compute span."""
        start, self._compute = self._compute, None
        if start is None:
            return
        if self.cuda:
            self.span("gpu_fwd_bwd", start, self.event())
        else:
            self.add("gpu_fwd_bwd", time.perf_counter() - start)

    def end_step(self) -> None:
        """Close this optimizer step's record; fold records two steps old (their events are done) into the totals."""
        if not self.enabled:
            return
        now = time.perf_counter()
        with self._lock:
            host, self._host = self._host, {}
        host["step"] = now - (self._clock if self._clock is not None else now)
        self._clock = now
        self._pending.append((host, self._spans))
        self._spans = []
        while len(self._pending) > 2:
            self._resolve(*self._pending.pop(0))

    def _resolve(self, host: dict[str, float], spans: list[_Span]) -> None:
        ms = {k: 1e3 * v for k, v in host.items()}
        for key, start, end in spans:
            end.synchronize()
            ms[key] = ms.get(key, 0.0) + start.elapsed_time(end)
        ms["exposed"] = max(0.0, ms.get("step", 0.0) - ms.get("gpu_fwd_bwd", 0.0) - ms.get("cpu_adam", 0.0))
        for k in KEYS:
            self._totals[k] += ms.get(k, 0.0)
        self._steps += 1

    # -- reading -----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget what was measured so far (e.g. warm-up steps); the next forward starts the clock."""
        self._pending.clear()
        self._spans = []
        with self._lock:
            self._host = {}
        self._totals = dict.fromkeys(KEYS, 0.0)
        self._steps = 0
        self._clock = None

    def summary(self) -> dict[str, float]:
        """Mean ms per optimizer step since `reset()` for every key (empty when disabled or no step yet)."""
        while self._pending:
            self._resolve(*self._pending.pop(0))
        if not self.enabled or self._steps == 0:
            return {}
        return {k: self._totals[k] / self._steps for k in KEYS}


def format_breakdown(b: dict[str, float]) -> str:
    """One line for a log:
    'step 634.1 ms = fwd+bwd 175.1 + cpu adam 452.2 + exposed 6.8 (h2d tail 0.0) | overlapped: ...'."""
    if not b:
        return ""
    head = (
        f"step {b['step']:.1f} ms = fwd+bwd {b['gpu_fwd_bwd']:.1f} + cpu adam {b['cpu_adam']:.1f}"
        f" + exposed {b['exposed']:.1f} (h2d tail {b['h2d_tail']:.1f})"
    )
    tail = (
        f" | overlapped: gpu adam {b.get('gpu_adam', 0.0):.1f},"
        f" overlapped cpu adam {b.get('overlapped_cpu_adam', 0.0):.1f}"
        + (f", streamed adam {b['streamed_adam']:.1f} (host waited {b.get('stream_wait', 0.0):.1f} for it)"
           if b.get("streamed_adam") else "")
        + f" (training waited {b.get('update_wait', 0.0):.1f}),"
        f" d2h {b['d2h']:.1f}, host fold {b['host_fold']:.1f}, fold wait {b['fold_wait']:.1f}, h2d {b['h2d']:.1f}"
    )
    if b.get("nvme_wait"):
        tail += f" | nvme wait {b['nvme_wait']:.1f} (inside cpu adam)"
    return head + tail
