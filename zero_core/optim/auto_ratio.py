"""`offload_optimizer.ratio: "auto"`: the largest device share of the optimizer that fits, chosen after a
measured first step.

The run starts fully offloaded (a SplitAdamW whose device share is empty). After its first optimizer step
the peak device memory of forward, backward and the update is known; what is left under the device's
limit (its memory, or the per-process fraction a memory cap set, e.g. zbench's `gpu_memory_cap_gib`),
less a safety margin, holds the device share: 12 bytes of fp32 master and moments per element, plus 4
bytes of fp32 gradient held from a bucket's reduction to the step. The leading buckets that fit move to
the device once, in partition order (forward order), and stay there; the host gives back the memory their
states held (optim/__init__.py's `_moved`).

The probe is injectable: a CPU run has no device memory to measure (`NoDeviceProbe` keeps everything
offloaded), and tests drive the rule with a fake one.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from .param_groups import Run

DEVICE_BYTES_PER_ELEMENT = 16  # fp32 master + exp_avg + exp_avg_sq, and the fp32 gradient until the step
MARGIN = 0.05  # of the limit, for allocator fragmentation and step-to-step variation


class MemoryProbe(Protocol):
    def limit_bytes(self) -> int | None:
        """Device memory this process may use (None: nothing to measure)."""

    def peak_bytes(self) -> int:
        """The peak this process reserved so far."""


class CudaProbe:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def limit_bytes(self) -> int | None:
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(total * torch.cuda.get_per_process_memory_fraction(self.device))

    def peak_bytes(self) -> int:
        return int(torch.cuda.max_memory_reserved(self.device))


class NoDeviceProbe:
    def limit_bytes(self) -> int | None:
        return None

    def peak_bytes(self) -> int:
        return 0


def probe_for(device: torch.device) -> MemoryProbe:
    return CudaProbe(device) if device.type == "cuda" else NoDeviceProbe()


def segments_that_fit(runs: list[list[Run]], limit: int | None, peak: int) -> int:
    """How many leading segments' states fit in `limit` beside `peak` (never all: some share stays offloaded,
    as the run asked for offload)."""
    if limit is None:
        return 0
    room = (limit * (1.0 - MARGIN) - peak) // DEVICE_BYTES_PER_ELEMENT
    count = 0
    for seg in runs:
        if seg[-1][1] > room:
            break
        count += 1
    return min(count, max(len(runs) - 1, 0))


class AutoOffload:
    """Held by the optimizer of a `ratio: "auto"` run until its first step; `settle` returns the optimizer to
    train with from then on."""

    def __init__(self, runs: list[list[Run]], probe: MemoryProbe, rebuild: Callable[[int], object]) -> None:
        self.runs, self.probe, self.rebuild = runs, probe, rebuild
        self.chosen: int | None = None  # leading segments moved to the device

    def settle(self, current):
        self.chosen = segments_that_fit(self.runs, self.probe.limit_bytes(), self.probe.peak_bytes())
        return self.rebuild(self.chosen) if self.chosen else current
