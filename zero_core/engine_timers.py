"""`engine.timers`: DeepSpeed's SynchronizedWallClockTimer as scripts use it, `engine.timers(name).start()` /
`.stop()`, `.elapsed()` in milliseconds, and `engine.timers.log([names])` printing `[Rank 0] time (ms) | name: x.xx`.
With `wall_clock_breakdown: true` the engine times its own phases with them and prints DeepSpeed's lines
(engine_wall_clock.py).

Wall-clock, the device synchronised at each start and stop on CUDA, so that a span covers the kernels launched
in it (DeepSpeed records CUDA events instead; a synchronised wall clock measures the same span)."""

from __future__ import annotations

import time
from typing import Any, Iterable

import torch


class EngineTimer:
    def __init__(self, name: str, device: torch.device) -> None:
        self.name, self.device = name, device
        self.started_at: float | None = None
        self.spans: list[float] = []  # seconds of each start-stop span since the last reset

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def start(self) -> None:
        if self.started:
            raise RuntimeError(f"timer {self.name!r} is already started; stop() it before starting it again")
        self.started_at = self._now()

    def stop(self, reset: bool = False, record: bool = False) -> None:
        """`reset` and `record` are DeepSpeed's arguments, which its timer ignores too."""
        if self.started_at is None:
            raise RuntimeError(f"timer {self.name!r} is not started; start() it before stop()")
        self.spans.append(self._now() - self.started_at)
        self.started_at = None

    def reset(self) -> None:
        self.started_at, self.spans = None, []

    def elapsed(self, reset: bool = True) -> float:
        """Milliseconds summed over the spans (a running span counts up to now and goes on), then reset if asked."""
        running = self.started
        if running:
            self.stop()
        total = sum(self.spans) * 1000.0
        if reset:
            self.reset()
        if running:
            self.start()
        return total

    def mean(self) -> float:
        """Mean span in seconds, its shortest and longest tenth left out (DeepSpeed's trimmed mean)."""
        self.elapsed(reset=False)
        spans = sorted(self.spans)
        cut = int(len(spans) * 0.1)
        kept = spans[cut:len(spans) - cut] or spans
        return sum(kept) / len(kept) if kept else 0.0


def _check_normalizer(call: str, normalizer: float) -> None:
    if not normalizer > 0:
        raise ValueError(f"timers.{call} normalizer must be > 0, got {normalizer!r}; pass a positive number")


class EngineTimers:
    """Named timers, made on first use."""

    def __init__(self, device: torch.device, rank: int) -> None:
        self.device, self.rank = device, rank
        self.timers: dict[str, EngineTimer] = {}

    def __call__(self, name: str) -> EngineTimer:
        if name not in self.timers:
            self.timers[name] = EngineTimer(name, self.device)
        return self.timers[name]

    def get_timers(self) -> dict[str, EngineTimer]:
        return self.timers

    def log(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True, memory_breakdown: bool = False,
            ranks: Any = None) -> str:
        """Print each named timer's milliseconds divided by `normalizer` on the given ranks (rank 0 by default);
        the line is returned too."""
        _check_normalizer("log", normalizer)
        line = "time (ms)" + "".join(f" | {n}: {self.timers[n].elapsed(reset=reset) / normalizer:.2f}"
                                     for n in names if n in self.timers)
        if self.rank in (ranks or [0]) or (ranks or [0])[0] == -1:  # [-1]: every rank, as DeepSpeed's
            print(f"[Rank {self.rank}] {line}", flush=True)  # DeepSpeed's print_dist prefix
        return line

    def get_mean(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> dict[str, float]:
        """Each named timer's trimmed mean span in milliseconds, divided by `normalizer`."""
        _check_normalizer("get_mean", normalizer)
        return {n: self.timers[n].mean() * 1000.0 / normalizer for n in names if n in self.timers}
